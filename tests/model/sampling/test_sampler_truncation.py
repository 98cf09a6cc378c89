"""The sampler's draws against the exact distributions its documented truncation rules define: temperature,
top-k (ties with the k-th kept), top-p (the smallest set reaching p, ties with the last kept), min-p, all of
them combined with penalties, on small and large vocabularies; the kept sets listed on a large vocabulary; and
a row with no probability mass left, which falls back to the argmax.

Draw tests compare 20,000 draws with the expected distribution by a chi-square test at a fixed significance
(alpha = 1e-3, critical values by the Wilson-Hilferty approximation) with fixed seeds, so they are
deterministic (helpers/sampler_cases.py). The draw tests run with the production constants and again with tiny
ones that force the other code paths (block draws over many blocks, truncated rows drawn over whole rows,
top-p cut-offs found only after a full sort).
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.sampler_cases import (
    LOGITS,
    assert_matches,
    chi2_critical,
    draw,
    make_batch,
    ref_penalised,
    ref_processed,
    softmax,
    top_logprobs,
)
from nvllm.model.sampling.sampler import sample

# ---------------------------------------------------------------- draws vs exact distributions


class TestDrawDistributions:
    @pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
    def test_temperature(self, paths, temperature):
        tokens = draw(LOGITS, temperature=temperature)
        assert_matches(tokens, softmax(ref_processed(LOGITS, temperature)))

    @pytest.mark.parametrize("top_k", [1, 3, 4, 6])
    def test_top_k_keeps_ties_with_the_kth(self, paths, top_k):
        # k=3 and k=6 cut inside ties (1.5,1.5) and (0.7,0.7): both tied tokens stay.
        tokens = draw(LOGITS, temperature=0.9, top_k=top_k)
        expected = softmax(ref_processed(LOGITS, 0.9, top_k=top_k))
        assert np.count_nonzero(expected) == {1: 1, 3: 3, 4: 5, 6: 7}[top_k]
        assert_matches(tokens, expected)

    def test_top_p_keeps_tokens_tied_with_the_last_kept(self, paths):
        # Probabilities 0.4, 0.2, 0.2, 0.1, 0.1: top_p 0.5 is reached with {0.4, 0.2}; the other
        # 0.2 ties with the last kept token and stays; the 0.1s go.
        logits = np.log(np.array([0.2, 0.1, 0.4, 0.1, 0.2], np.float32))
        tokens = draw(logits, top_p=0.5)
        assert_matches(tokens, np.array([0.4, 0.0, 0.8, 0.0, 0.4]) / 1.6)

    @pytest.mark.parametrize("top_p", [0.05, 0.3, 0.62, 0.9, 0.999])
    def test_top_p(self, paths, top_p):
        tokens = draw(LOGITS, temperature=0.8, top_p=top_p)
        assert_matches(tokens, softmax(ref_processed(LOGITS, 0.8, top_p=top_p)))

    def test_top_p_smallest_set_reaching_p(self, paths):
        # 0.5 + 0.3 = 0.8 >= 0.75: exactly two tokens, the 0.2 is dropped.
        logits = np.log(np.array([0.3, 0.2, 0.5], np.float32))
        assert_matches(draw(logits, top_p=0.75), np.array([0.375, 0.0, 0.625]))

    @pytest.mark.parametrize("min_p", [0.05, 0.3, 0.61, 1.0])
    def test_min_p(self, paths, min_p):
        tokens = draw(LOGITS, temperature=1.3, min_p=min_p)
        assert_matches(tokens, softmax(ref_processed(LOGITS, 1.3, min_p=min_p)))

    def test_min_p_one_keeps_only_the_tied_best(self, paths):
        logits = np.array([3.0, 1.0, 3.0, 2.9], np.float32)
        assert_matches(draw(logits, min_p=1.0), np.array([0.5, 0.0, 0.5, 0.0]))

    @pytest.mark.parametrize("top_k,top_p,min_p", [(6, 0.8, 0.1), (4, 0.55, 0.0), (0, 0.7, 0.2),
                                                   (5, 1.0, 0.3)])
    def test_all_combined(self, paths, top_k, top_p, min_p):
        prompt, output, banned = [0, 3, 7], [1, 1, 4, 12], [5]
        pen = dict(repetition_penalty=1.3, frequency_penalty=0.2, presence_penalty=-0.3)
        tokens = draw(LOGITS, temperature=0.7, top_k=top_k, top_p=top_p, min_p=min_p,
                      prompt=prompt, output=output, banned=banned, **pen)
        x = ref_penalised(LOGITS, prompt, output, 1.3, 0.2, -0.3, banned)
        assert_matches(tokens, softmax(ref_processed(x, 0.7, top_k, top_p, min_p)))

    def test_many_blocks_and_impossible_tokens(self, paths):
        # A 1000-token vocabulary whose mass sits on tokens spread over many blocks.
        logits = np.full(1000, -np.inf, np.float32)
        support = np.array([3, 255, 256, 511, 600, 999])
        logits[support] = [0.5, 1.0, -0.2, 0.0, 0.8, 0.3]
        tokens = draw(logits, n=4000, temperature=1.1)
        assert set(np.unique(tokens)) <= set(support.tolist())
        assert_matches(tokens, softmax(ref_processed(logits, 1.1)))

    def test_chi_square_check_rejects_a_wrong_distribution(self):
        # The check has power: draws at temperature 1.0 do not pass for temperature 1.25.
        tokens = draw(LOGITS, temperature=1.0)
        with pytest.raises(AssertionError, match="chi-square"):
            assert_matches(tokens, softmax(ref_processed(LOGITS, 1.25)))

    def test_chi_square_critical_values(self):
        # Wilson-Hilferty against tabulated chi-square 0.999 quantiles.
        for df, table in [(1, 10.828), (4, 18.467), (10, 29.588), (12, 32.909)]:
            assert abs(chi2_critical(df) - table) / table < 0.035


# ---------------------------------------------------------------- kept sets on large vocabularies


@pytest.mark.parametrize("seed", [0, 1])
def test_kept_sets_match_the_rules_on_a_large_vocab(paths, seed):
    """Peaky logits over 5000 tokens, random parameters: the listed survivors (all of them, as
    fewer than 20 remain) are exactly the reference's, and every draw is one of them."""
    rng = np.random.default_rng(seed)
    n, vocab = 24, 5000
    logits = (rng.standard_normal((n, vocab)) * 1.5).astype(np.float32)
    logits[np.arange(n)[:, None], rng.integers(0, vocab, (n, 6))] += 20.0  # a few strong tokens
    logits[0, :3] = logits[0].max() + 1  # exact ties at the top
    temps = rng.uniform(0.5, 1.5, n).astype(np.float32)
    top_k = rng.choice([0, 3, 8, 15], n)
    top_p = rng.choice([1.0, 0.5, 0.8, 0.95], n).astype(np.float32)
    min_p = rng.choice([0.0, 0.05, 0.3], n).astype(np.float32)
    top_k[(top_k == 0) & (top_p == 1)] = 12  # keep survivors under 20
    out = sample(logits, make_batch(n, temperature=temps, top_k=top_k, top_p=top_p, min_p=min_p,
                                    num_logprobs=20, seed=seed))
    for i in range(n):
        ref = ref_processed(logits[i], temps[i], int(top_k[i]), float(top_p[i]), float(min_p[i]))
        kept = np.flatnonzero(np.isfinite(ref))
        assert sorted(top_logprobs(out, i)[0].tolist()) == kept.tolist()
        assert out.token_ids[i] in kept


def test_rows_with_no_probability_mass_fall_back_to_argmax():
    logits = np.array([[-np.inf, -np.inf, -np.inf]], np.float32)
    out = sample(logits, make_batch(1, temperature=1.0))
    assert 0 <= out.token_ids[0] < 3

