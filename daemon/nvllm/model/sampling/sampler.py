"""Logits -> token ids for a whole batch at once, each row with its own parameters and generator.

Order of work (vLLM's): the allowed-token masks of constrained rows (structured output) -> -inf
elsewhere; logit_bias added; banned tokens -> -inf; repetition penalty (prompt + output tokens);
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

Everything stays float32. The steps live beside this file (penalties, truncation, draws, logprobs; the
batch's arrays in batch.py); `python -m nvllm.bench sampler` times the sampler.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nvllm.model.sampling import draws, mask, penalties, truncation
from nvllm.model.sampling.batch import SamplingBatch
from nvllm.model.sampling.logprobs import fill_top

GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: temperatures below it are greedy

_F32 = np.float32


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
        owned = False
        if batch.allowed_tokens is not None:
            assert batch.allowed_rows is not None  # __post_init__ sets it with allowed_tokens
            if len(batch.allowed_rows):
                logits, owned = mask.masked(logits, batch.allowed_rows, batch.allowed_tokens), True
        if batch.bias_rows is not None and len(batch.bias_rows):
            logits = logits if owned else logits.copy()
            logits[batch.bias_rows, batch.bias_ids] += batch.bias_values   # pairs are unique: no add.at
            owned = True
        x, owned = penalties.apply(logits, batch, owned)
        greedy = batch.temperature < GREEDY_EPS
        g, s = np.flatnonzero(greedy), np.flatnonzero(~greedy)
        if g.size:
            _greedy(x if g.size == n else x[g], g, batch, tokens, logprobs, top)
        if s.size:
            _random(x, owned, s, batch, tokens, logprobs, top)
    return SamplerOutput(tokens, logprobs, top)


def greedy(logits: np.ndarray) -> SamplerOutput:
    """Each row's argmax: what sample() gives rows at temperature 0 with nothing applied before it (no mask,
    bias, penalty, banned token or logprobs; engine/sampling_rows.plain_greedy says when), without the
    per-row arrays of a SamplingBatch: the common decode step's sampling in one pass over the logits."""
    n = logits.shape[0]
    return SamplerOutput(np.argmax(logits, axis=1).astype(np.int64, copy=False), np.full(n, np.nan, dtype=_F32),
                         [None] * n)


# ---------------------------------------------------------------- greedy rows


def _greedy(x: np.ndarray, rows: np.ndarray, batch: SamplingBatch, tokens: np.ndarray,
            logprobs: np.ndarray, top: list) -> None:
    """x: [G, V] penalised logits of the greedy rows."""
    tok = np.argmax(x, axis=1)
    tokens[rows] = tok
    num_logprobs = batch.num_logprobs
    assert num_logprobs is not None  # __post_init__ fills it
    want = np.flatnonzero(num_logprobs[rows] >= 0)
    if not want.size:
        return
    xw = x[want] if want.size < len(rows) else x
    mx = xw.max(axis=1)
    tmp = np.subtract(xw, mx[:, None])  # [W, V]
    lse = mx + np.log(np.exp(tmp, out=tmp).sum(axis=1))  # log-sum-exp at temperature 1
    chosen = xw[np.arange(want.size), tok[want]]
    logprobs[rows[want]] = np.minimum(chosen - lse, 0)
    floor = np.full(want.size, -np.inf, dtype=_F32)
    fill_top(xw, None, floor, lse, rows[want], num_logprobs, top)


# ---------------------------------------------------------------- sampled rows


def _random(x: np.ndarray, owned: bool, rows: np.ndarray, batch: SamplingBatch, tokens: np.ndarray,
            logprobs: np.ndarray, top: list) -> None:
    n, vocab = x.shape
    num_logprobs = batch.num_logprobs
    assert num_logprobs is not None  # __post_init__ fills it
    temp = batch.temperature[rows][:, None]
    if rows.size == n:
        xs = np.divide(x, temp, out=x) if owned else x / temp  # [S, V]
    else:
        xs = x[rows]
        xs /= temp
    u = draws.uniforms(batch.generators, rows)
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
        thr[trunc] = truncation.thresholds(xt, mx[trunc], k[trunc], p[trunc], minp[trunc])
        count[trunc] = draws.row_counts(xt >= thr[trunc, None])
    # Few survivors: pack them; many (or no truncation): draw over whole rows. Each row's own count
    # decides, so the layout (and the token) never depends on the rest of the batch.
    packed = count <= draws.PACK_MAX
    for part in (np.flatnonzero(packed), np.flatnonzero(~packed)):
        if not part.size:
            continue
        sub = xs if part.size == rows.size else xs[part]  # [P, V]
        if packed[part[0]]:
            vals, ids = draws.pack(sub >= thr[part, None], sub, None)  # [P, C]
            tok, shift = draws.packed(vals, ids, mx[part], u[part])
            floor = np.full(part.size, -np.inf, dtype=_F32)
        else:
            vals, ids, floor = sub, None, thr[part]
            tok, shift = draws.full(sub, mx[part], thr[part], u[part])
        bad = ~np.isfinite(shift)
        if bad.any():
            tok[bad] = np.argmax(sub[bad], axis=1)
        out_rows = rows[part]
        tokens[out_rows] = tok
        want = np.flatnonzero(num_logprobs[out_rows] >= 0)
        if want.size:
            chosen = sub[want, tok[want]]
            logprobs[out_rows[want]] = np.minimum(chosen - shift[want], 0)
            fill_top(vals[want], None if ids is None else ids[want], floor[want], shift[want],
                     out_rows[want], num_logprobs, top)
