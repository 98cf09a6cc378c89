"""Logits -> token ids for a whole batch at once, each row with its own parameters and generator.

Order of work (vLLM's): banned tokens -> -inf; repetition penalty (prompt + output tokens);
frequency and presence penalties (output tokens); then greedy rows take the argmax, and the other rows
are divided by their temperature and truncated by top-k, top-p and min-p before one draw each.

Rules, exactly:
- top-k keeps every token whose logit is >= the k-th largest (so ties with the k-th are all kept,
  as in vLLM). k <= 0 or k >= vocab is off.
- top-p works on the distribution left by top-k. With the probabilities sorted in descending order,
  m is the smallest count whose sum reaches top_p (within a relative 1e-6, for float32 rounding);
  every token whose probability equals the m-th one's is kept too, so the kept set never depends on
  the order of tied tokens. top_p >= 1 is off; if rounding means the sum never reaches top_p, all
  tokens are kept.
- min-p keeps tokens with logit >= max logit + log(min_p) (float32), i.e. probability >= min_p * max
  probability (ties at the cut-off kept). Truncation never changes that ratio, so min-p needs no
  renormalisation. min_p <= 0 is off.
- Each truncation keeps "logit >= some cut-off", so a row's kept set is one threshold on its logits.
- The draw: one uniform u from the row's own generator, then the first token, in token-id order,
  whose cumulative kept probability mass exceeds u * total. Only the row's own values enter, so a
  seeded row draws the same token whatever else shares the batch.
- Logprobs are of the processed distribution: log-softmax of the penalised, temperature-scaled,
  truncated logits (dropped tokens are -inf and never listed). Greedy rows report the penalised
  logits at temperature 1, untruncated. `logprobs[i]` is NaN for rows with num_logprobs < 0.
  top_logprobs lists up to num_logprobs tokens with finite logprob, most likely first, ties by
  lower id (also across the N-th place).
- A row whose logits leave no probability mass (all -inf, or NaN) falls back to its argmax.

Everything stays float32. `python -m nvllm.model.sampler` times the sampler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: temperatures below it are greedy
# top-p first looks for its cut-off among this many best tokens; rows that need more look at 8x.
TOP_P_PREFIX = 1024
TOP_P_RTOL = 1e-6
DRAW_BLOCK = 256  # un-truncated rows draw through per-block sums instead of a vocab-long cumsum
PACK_MAX = 2048  # rows keeping at most this many tokens draw from them packed

_F32 = np.float32


@dataclass
class SamplingBatch:
    """One row per sequence being sampled; built by the engine."""

    temperature: np.ndarray  # [N] float32, < 1e-5 = greedy
    top_p: np.ndarray  # [N] float32, >= 1 = off
    top_k: np.ndarray  # [N] int32, <= 0 = off
    min_p: np.ndarray  # [N] float32, <= 0 = off
    presence_penalty: np.ndarray  # [N] float32
    frequency_penalty: np.ndarray  # [N] float32
    repetition_penalty: np.ndarray  # [N] float32, 1 = off
    output_token_ids: list[np.ndarray]  # per row, int64, tokens generated so far
    prompt_token_ids: list[np.ndarray]  # per row, int64
    generators: list[np.random.Generator]
    banned_token_ids: list[np.ndarray | None] = field(default_factory=list)  # e.g. EOS under min_tokens
    num_logprobs: np.ndarray | None = None  # [N] int32, -1 = none; None = none for every row

    def __post_init__(self) -> None:
        n = len(self.temperature)
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            setattr(self, name, np.asarray(getattr(self, name), dtype=_F32).reshape(n))
        self.top_k = np.asarray(self.top_k, dtype=np.int32).reshape(n)
        if self.num_logprobs is None:
            self.num_logprobs = np.full(n, -1, dtype=np.int32)
        self.num_logprobs = np.asarray(self.num_logprobs, dtype=np.int32).reshape(n)
        if not self.banned_token_ids:
            self.banned_token_ids = [None] * n
        for name in ("output_token_ids", "prompt_token_ids", "generators", "banned_token_ids"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"SamplingBatch.{name} has {len(getattr(self, name))} rows, expected {n}")

    @property
    def num_rows(self) -> int:
        return len(self.temperature)


@dataclass
class SamplerOutput:
    token_ids: np.ndarray  # [N] int64
    logprobs: np.ndarray  # [N] float32: the chosen token's, of the processed distribution; NaN if not asked
    top_logprobs: list[tuple[np.ndarray, np.ndarray] | None]  # per row (ids int64, logprobs float32)


def make_generator(seed: int | None) -> np.random.Generator:
    """A row's own generator: seeded when the request gave a seed, else from OS entropy."""
    return np.random.default_rng(None if seed is None else seed % (1 << 64))


def sample(logits: np.ndarray, batch: SamplingBatch) -> SamplerOutput:
    """[N, V] float32 logits -> one token per row, each row under its own parameters."""
    logits = np.asarray(logits, dtype=_F32)
    n, _ = logits.shape
    if batch.num_rows != n:
        raise ValueError(f"logits have {n} rows, the sampling batch {batch.num_rows}")
    tokens = np.empty(n, dtype=np.int64)
    logprobs = np.full(n, np.nan, dtype=_F32)
    top: list[tuple[np.ndarray, np.ndarray] | None] = [None] * n
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        x, owned = _apply_penalties(logits, batch)
        greedy = batch.temperature < GREEDY_EPS
        g, s = np.flatnonzero(greedy), np.flatnonzero(~greedy)
        if g.size:
            _greedy(x if g.size == n else x[g], g, batch, tokens, logprobs, top)
        if s.size:
            _random(x, owned, s, batch, tokens, logprobs, top)
    return SamplerOutput(tokens, logprobs, top)


# ---------------------------------------------------------------- penalties


def _flat_index(rows: np.ndarray, per_row, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions row*V + token of every token listed for the given rows, and each one's row."""
    arrays = [np.asarray(per_row[i], dtype=np.int64).reshape(-1) for i in rows]
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    if not lengths.sum():
        return np.empty(0, np.int64), np.empty(0, np.int64)
    toks = np.concatenate(arrays)
    if toks.min() < 0 or toks.max() >= vocab:  # would otherwise land in a neighbouring row
        raise ValueError(f"token id out of range [0, {vocab}) in the sampling batch")
    row_of = np.repeat(rows, lengths)
    return row_of * vocab + toks, row_of


def _apply_penalties(logits: np.ndarray, batch: SamplingBatch) -> tuple[np.ndarray, bool]:
    """Bans, then repetition, then frequency/presence penalties; copies the logits only if needed."""
    n, vocab = logits.shape
    ban = np.array([b is not None and len(b) > 0 for b in batch.banned_token_ids], dtype=bool)
    rep = batch.repetition_penalty != 1.0
    fp = (batch.frequency_penalty != 0.0) | (batch.presence_penalty != 0.0)
    if not (ban.any() or rep.any() or fp.any()):
        return logits, False
    x = np.array(logits, dtype=_F32, order="C", copy=True)
    xf = x.reshape(-1)  # view: [N, V] -> [N*V]
    if ban.any():
        idx, _ = _flat_index(np.flatnonzero(ban), batch.banned_token_ids, vocab)
        xf[idx] = -np.inf
    if rep.any():
        rows = np.flatnonzero(rep)
        seen = {int(i): np.concatenate((np.asarray(batch.prompt_token_ids[i], np.int64).reshape(-1),
                                        np.asarray(batch.output_token_ids[i], np.int64).reshape(-1)))
                for i in rows}  # prompt + output tokens per row
        idx, row_of = _flat_index(rows, seen, vocab)
        # Duplicate positions all read the original value and write the same result: idempotent.
        vals = xf[idx]
        pen = batch.repetition_penalty[row_of]
        xf[idx] = np.where(vals > 0, vals / pen, vals * pen)
    if fp.any():
        idx, _ = _flat_index(np.flatnonzero(fp), batch.output_token_ids, vocab)
        pos, counts = np.unique(idx, return_counts=True)
        row_of = pos // vocab
        xf[pos] -= batch.frequency_penalty[row_of] * counts.astype(_F32) + batch.presence_penalty[row_of]
    return x, True


# ---------------------------------------------------------------- greedy rows


def _greedy(x: np.ndarray, rows: np.ndarray, batch: SamplingBatch, tokens: np.ndarray,
            logprobs: np.ndarray, top: list) -> None:
    """x: [G, V] penalised logits of the greedy rows."""
    tok = np.argmax(x, axis=1)
    tokens[rows] = tok
    want = np.flatnonzero(batch.num_logprobs[rows] >= 0)
    if not want.size:
        return
    xw = x[want] if want.size < len(rows) else x
    mx = xw.max(axis=1)
    tmp = np.subtract(xw, mx[:, None])  # [W, V]
    lse = mx + np.log(np.exp(tmp, out=tmp).sum(axis=1))  # log-sum-exp at temperature 1
    chosen = xw[np.arange(want.size), tok[want]]
    logprobs[rows[want]] = np.minimum(chosen - lse, 0)
    floor = np.full(want.size, -np.inf, dtype=_F32)
    _fill_top(xw, None, floor, lse, rows[want], batch.num_logprobs, top)


# ---------------------------------------------------------------- sampled rows


def _random(x: np.ndarray, owned: bool, rows: np.ndarray, batch: SamplingBatch, tokens: np.ndarray,
            logprobs: np.ndarray, top: list) -> None:
    n, vocab = x.shape
    temp = batch.temperature[rows][:, None]
    if rows.size == n:
        xs = np.divide(x, temp, out=x) if owned else x / temp  # [S, V]
    else:
        xs = x[rows]
        xs /= temp
    u = np.empty(rows.size, dtype=np.float64)
    for j, i in enumerate(rows):  # one uniform per row, from that row's own generator
        u[j] = batch.generators[i].random()
    mx = xs.max(axis=1)
    k = batch.top_k[rows]
    k = np.where((k > 0) & (k < vocab), k, 0)
    p = batch.top_p[rows]
    minp = batch.min_p[rows]
    thr = np.full(rows.size, -np.inf, dtype=_F32)
    count = np.full(rows.size, vocab, dtype=np.int64)
    trunc = np.flatnonzero((k > 0) | (p < 1) | (minp > 0))
    if trunc.size:
        xt = xs if trunc.size == rows.size else xs[trunc]
        thr[trunc] = _thresholds(xt, mx[trunc], k[trunc], p[trunc], minp[trunc])
        count[trunc] = _row_counts(xt >= thr[trunc, None])
    # Few survivors: pack them; many (or no truncation): draw over whole rows. Each row's own count
    # decides, so the layout (and the token) never depends on the rest of the batch.
    packed = count <= PACK_MAX
    for part in (np.flatnonzero(packed), np.flatnonzero(~packed)):
        if not part.size:
            continue
        sub = xs if part.size == rows.size else xs[part]  # [P, V]
        if packed[part[0]]:
            vals, ids = _pack(sub >= thr[part, None], sub, None)  # [P, C]
            tok, shift = _draw_packed(vals, ids, mx[part], u[part])
            floor = np.full(part.size, -np.inf, dtype=_F32)
        else:
            vals, ids, floor = sub, None, thr[part]
            tok, shift = _draw_full(sub, mx[part], thr[part], u[part])
        bad = ~np.isfinite(shift)
        if bad.any():
            tok[bad] = np.argmax(sub[bad], axis=1)
        out_rows = rows[part]
        tokens[out_rows] = tok
        want = np.flatnonzero(batch.num_logprobs[out_rows] >= 0)
        if want.size:
            chosen = sub[want, tok[want]]
            logprobs[out_rows[want]] = np.minimum(chosen - shift[want], 0)
            _fill_top(vals[want], None if ids is None else ids[want], floor[want], shift[want],
                      out_rows[want], batch.num_logprobs, top)


def _row_counts(mask: np.ndarray) -> np.ndarray:
    """[M, V] bool -> [M] trues per row; sparse masks go through flatnonzero, much faster than
    a per-row count_nonzero."""
    m, width = mask.shape
    if np.count_nonzero(mask) <= PACK_MAX * m:
        return np.bincount(np.flatnonzero(mask) // width, minlength=m)
    return np.count_nonzero(mask, axis=1)


def _thresholds(x: np.ndarray, mx: np.ndarray, k: np.ndarray, p: np.ndarray,
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


def _pack(mask: np.ndarray, v: np.ndarray, ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
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


def _draw_packed(vals: np.ndarray, ids: np.ndarray, mx: np.ndarray, u: np.ndarray):
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


def _draw_full(x: np.ndarray, mx: np.ndarray, thr: np.ndarray, u: np.ndarray):
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


# ---------------------------------------------------------------- logprobs


def _best(v: np.ndarray, ids: np.ndarray | None, floor: np.ndarray, nmax: int):
    """Each row's entries that can be among its nmax best with v >= floor: values and ids [W, c],
    sorted by value descending, then lower id first (-inf padding)."""
    w, width = v.shape
    if width > 256 and nmax < width:
        if ids is None and width >= nmax * DRAW_BLOCK:
            # The nmax-th largest block maximum: at least nmax values reach it. Cheaper than a
            # partition of the whole row.
            bmax = np.maximum.reduceat(v, np.arange(0, width, DRAW_BLOCK), axis=1)  # [W, blocks]
            nb = bmax.shape[1]
            low = np.partition(bmax, nb - nmax, axis=1)[:, nb - nmax]
        else:
            low = np.partition(v, width - nmax, axis=1)[:, width - nmax]
        cv, cid = _pack(v >= np.maximum(low, floor)[:, None], v, ids)
    else:
        cv = np.where(v >= floor[:, None], v, -np.inf).astype(_F32)
        cid = np.broadcast_to(np.arange(width), v.shape) if ids is None else ids
    order = np.lexsort((cid, -cv), axis=1)[:, :nmax]  # value descending, then lower id
    return np.take_along_axis(cv, order, axis=1), np.take_along_axis(cid, order, axis=1)


def _fill_top(vals: np.ndarray, ids: np.ndarray | None, floor: np.ndarray, shift: np.ndarray,
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


# ---------------------------------------------------------------- timing


def _bench_batch(n: int, vocab: int, rng: np.random.Generator, **kw) -> SamplingBatch:
    full = lambda v, dt: np.full(n, v, dtype=dt)  # noqa: E731
    return SamplingBatch(
        temperature=full(kw.get("temperature", 0.8), _F32),
        top_p=full(kw.get("top_p", 1.0), _F32),
        top_k=full(kw.get("top_k", 0), np.int32),
        min_p=full(kw.get("min_p", 0.0), _F32),
        presence_penalty=full(kw.get("presence_penalty", 0.0), _F32),
        frequency_penalty=full(kw.get("frequency_penalty", 0.0), _F32),
        repetition_penalty=full(kw.get("repetition_penalty", 1.0), _F32),
        output_token_ids=[rng.integers(0, vocab, 128) for _ in range(n)],
        prompt_token_ids=[rng.integers(0, vocab, 512) for _ in range(n)],
        generators=[make_generator(i) for i in range(n)],
        banned_token_ids=[np.array([0, 2]) if kw.get("ban") else None for _ in range(n)],
        num_logprobs=full(kw.get("logprobs", -1), np.int32),
    )


def _main() -> None:
    import time

    n, vocab = 32, 49152
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((n, vocab)) * 3).astype(_F32)
    penalties = dict(repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.5, ban=True)
    cases = {
        "all methods (T=0.8 top_k=50 top_p=0.9 min_p=0.05 penalties bans logprobs=5)":
            dict(top_k=50, top_p=0.9, min_p=0.05, logprobs=5, **penalties),
        "all methods but top_k off (top_p=0.9 min_p=0.05 penalties logprobs=5)":
            dict(top_p=0.9, min_p=0.05, logprobs=5, **penalties),
        "top_p=0.95 only": dict(top_p=0.95),
        "temperature only (T=0.8)": dict(),
        "greedy only": dict(temperature=0.0),
        "greedy + penalties + logprobs=5": dict(temperature=0.0, logprobs=5, **penalties),
    }
    print(f"sample(): N={n} rows, V={vocab}, numpy {np.__version__}; ms per call, median (min) of 30")
    for name, kw in cases.items():
        batch = _bench_batch(n, vocab, rng, **kw)
        sample(logits, batch)
        times = []
        for _ in range(30):
            t0 = time.perf_counter()
            sample(logits, batch)
            times.append(time.perf_counter() - t0)
        print(f"  {np.median(times) * 1e3:7.2f} ({min(times) * 1e3:6.2f})  {name}")


if __name__ == "__main__":
    _main()
