"""What the sampler tests share (tests/model/sampling/test_sampler_*.py): the batch builder, the reference penalties and
truncation rules spelled out slowly in float64, the chi-square check that draws fit a distribution, and the
constants that force the sampler's other code paths (for each file's `paths` fixture).

Draw tests compare 20,000 draws with the expected distribution by a chi-square test at a fixed significance
(alpha = 1e-3, critical values by the Wilson-Hilferty approximation) with fixed seeds, so they are
deterministic."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from nvllm.model.sampling import draws, truncation
from nvllm.model.sampling.batch import SamplingBatch
from nvllm.model.sampling.sampler import SamplerOutput, make_generator, sample

NUM_DRAWS = 20_000
Z_ALPHA_1E3 = 3.090232306167813  # upper 0.1% point of the standard normal

# The production constants, and constants forcing the other paths: the params of each file's `paths` fixture.
PATHS = ["production", "small-blocks", "whole-row-draws", "full-sort-top-p"]


def use_path(path: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test under the production constants and under constants forcing the other paths."""
    if path == "small-blocks":
        monkeypatch.setattr(draws, "DRAW_BLOCK", 4)  # many blocks and a padded last block
    elif path == "whole-row-draws":
        monkeypatch.setattr(draws, "PACK_MAX", 0)  # truncated rows draw over whole rows, masked
        monkeypatch.setattr(draws, "DRAW_BLOCK", 4)
    elif path == "full-sort-top-p":
        monkeypatch.setattr(truncation, "TOP_P_PREFIX", 2)  # top-p rarely finds its cut-off in the prefix
    return path


def make_batch(n: int, *, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, presence_penalty=0.0,
               frequency_penalty=0.0, repetition_penalty=1.0, output=None, prompt=None, banned=None,
               generators=None, seed=0, num_logprobs=-1) -> SamplingBatch:
    def col(v, dt):
        return np.broadcast_to(np.asarray(v, dtype=dt), (n,)).copy()

    def rows(v):
        if v is None:
            return [np.zeros(0, np.int64)] * n
        if len(v) and np.ndim(v[0]) == 0:  # one list for every row
            return [np.asarray(v, np.int64)] * n
        return [np.asarray(a, np.int64) for a in v]

    if generators is None:
        generators = [make_generator(seed)] * n  # one stream shared by the rows, row after row
    return SamplingBatch(
        temperature=col(temperature, np.float32), top_p=col(top_p, np.float32),
        top_k=col(top_k, np.int32), min_p=col(min_p, np.float32),
        presence_penalty=col(presence_penalty, np.float32),
        frequency_penalty=col(frequency_penalty, np.float32),
        repetition_penalty=col(repetition_penalty, np.float32),
        output_token_ids=rows(output), prompt_token_ids=rows(prompt),
        generators=list(generators),
        banned_token_ids=[None] * n if banned is None else
        ([np.asarray(banned, np.int64)] * n if isinstance(banned[0], (int, np.integer)) else list(banned)),
        num_logprobs=col(num_logprobs, np.int32),
    )


def ref_penalised(logits, prompt=(), output=(), rep=1.0, freq=0.0, pres=0.0, banned=()):
    """vLLM's penalties, one token at a time, in float64."""
    x = np.asarray(logits, np.float64).copy()
    for t in banned:
        x[t] = -np.inf
    for t in set(prompt) | set(output):
        x[t] = x[t] / rep if x[t] > 0 else x[t] * rep
    for t, c in Counter(output).items():
        x[t] -= freq * c + pres
    return x


def ref_processed(x, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """The documented truncation rules, spelled out slowly in float64: -inf marks dropped tokens."""
    y = np.asarray(x, np.float64) / temperature
    keep = np.isfinite(y)
    if 0 < top_k < y.size:
        kth = np.sort(y)[::-1][top_k - 1]
        keep &= y >= kth  # ties with the k-th stay
    if top_p < 1:
        probs = np.where(keep, np.exp(y - y.max()), 0.0)
        probs /= probs.sum()
        desc = np.sort(probs)[::-1]
        m = int(np.argmax(np.cumsum(desc) >= top_p - 1e-9))
        keep &= probs >= desc[m]  # ties with the last kept one stay
    if min_p > 0:
        keep &= np.exp(y - y.max()) >= min_p  # p >= min_p * p_max
    return np.where(keep, y, -np.inf)


def softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def log_softmax(z):
    return z - (z.max() + np.log(np.exp(z - z.max()).sum()))


def chi2_critical(df: int, z: float = Z_ALPHA_1E3) -> float:
    """Wilson-Hilferty: (chi2/df)^(1/3) is close to normal with mean 1 - 2/(9df), var 2/(9df)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def assert_matches(tokens: np.ndarray, expected: np.ndarray) -> None:
    """Draws never hit zero-probability tokens and fit `expected` by chi-square at alpha 1e-3."""
    observed = np.bincount(tokens, minlength=expected.size)
    assert observed.size == expected.size, "a token outside the vocabulary was drawn"
    zero = expected == 0
    assert observed[zero].sum() == 0, f"zero-probability tokens drawn: {np.flatnonzero(observed * zero)}"
    exp_counts = expected[~zero] * tokens.size
    assert exp_counts.min() >= 5, "test design: every kept token needs an expected count >= 5"
    stat = float((((observed[~zero] - exp_counts) ** 2) / exp_counts).sum())
    df = int((~zero).sum()) - 1
    if df == 0:
        return  # a single kept token: the zero check above is the whole test
    crit = chi2_critical(df)
    assert stat < crit, f"chi-square {stat:.1f} >= {crit:.1f} (df={df}): {observed} vs {exp_counts}"


def draw(logits_row, seed=1234, n=NUM_DRAWS, **params) -> np.ndarray:
    logits = np.tile(np.asarray(logits_row, np.float32), (n, 1))  # [n, V]
    return sample(logits, make_batch(n, seed=seed, **params)).token_ids



def top_logprobs(out: SamplerOutput, row: int) -> tuple[np.ndarray, np.ndarray]:
    """The (ids, logprobs) listed for a row that asked for them."""
    listed = out.top_logprobs[row]
    assert listed is not None, f"row {row} lists no logprobs"
    return listed


# Fixed logits: a spread of probabilities, with exact ties, one -inf token.
LOGITS = np.array([2.0, 1.5, 1.5, 1.0, 0.7, 0.7, 0.2, -0.4, -1.0, -np.inf, -0.4, 0.1, 1.0],
                  dtype=np.float32)
