"""The sampler against the exact distributions its documented rules define.

Draw tests compare 20,000 draws with the expected distribution by a chi-square test at a fixed
significance (alpha = 1e-3, critical values by the Wilson-Hilferty approximation) with fixed seeds,
so they are deterministic. Every test runs with the production constants and again with tiny ones
that force the other code paths (block draws over many blocks, truncated rows drawn over whole
rows, top-p cut-offs found only after a full sort).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from nvllm.model.sampling import draws, truncation
from nvllm.model.sampling.batch import SamplingBatch
from nvllm.model.sampling.sampler import make_generator, sample

NUM_DRAWS = 20_000
Z_ALPHA_1E3 = 3.090232306167813  # upper 0.1% point of the standard normal


# ---------------------------------------------------------------- helpers


@pytest.fixture(params=["production", "small-blocks", "whole-row-draws", "full-sort-top-p"])
def paths(request, monkeypatch):
    """Run a test under the production constants and under constants forcing the other paths."""
    if request.param == "small-blocks":
        monkeypatch.setattr(draws, "DRAW_BLOCK", 4)  # many blocks and a padded last block
    elif request.param == "whole-row-draws":
        monkeypatch.setattr(draws, "PACK_MAX", 0)  # truncated rows draw over whole rows, masked
        monkeypatch.setattr(draws, "DRAW_BLOCK", 4)
    elif request.param == "full-sort-top-p":
        monkeypatch.setattr(truncation, "TOP_P_PREFIX", 2)  # top-p rarely finds its cut-off in the prefix
    return request.param


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


# Fixed logits: a spread of probabilities, with exact ties, one -inf token.
LOGITS = np.array([2.0, 1.5, 1.5, 1.0, 0.7, 0.7, 0.2, -0.4, -1.0, -np.inf, -0.4, 0.1, 1.0],
                  dtype=np.float32)


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


# ---------------------------------------------------------------- penalties


def greedy_logprobs(logits, **params):
    """The full penalised log-softmax, read back through a greedy row asking for every token."""
    v = len(logits)
    out = sample(np.asarray(logits, np.float32)[None], make_batch(1, temperature=0.0,
                                                                 num_logprobs=v, **params))
    ids, lps = out.top_logprobs[0]
    full = np.full(v, -np.inf)
    full[ids] = lps
    return out.token_ids[0], full


class TestPenalties:
    LOGITS = np.array([2.0, -2.0, 0.5, -0.5, 1.0, 0.0, 3.0], np.float32)

    def test_repetition_divides_positive_multiplies_negative(self):
        _, lp = greedy_logprobs(self.LOGITS, repetition_penalty=2.0, prompt=[0, 1, 5], output=[1, 3])
        hand = np.array([1.0, -4.0, 0.5, -1.0, 1.0, 0.0, 3.0])  # tokens 0, 1, 3, 5 appeared
        np.testing.assert_allclose(lp, log_softmax(hand), atol=1e-5)

    def test_frequency_and_presence_count_output_only(self):
        _, lp = greedy_logprobs(self.LOGITS, frequency_penalty=0.5, presence_penalty=0.25,
                                prompt=[0], output=[2, 2, 4, 2])
        hand = np.array([2.0, -2.0, 0.5 - 1.5 - 0.25, -0.5, 1.0 - 0.5 - 0.25, 0.0, 3.0])
        np.testing.assert_allclose(lp, log_softmax(hand), atol=1e-5)

    def test_repetition_before_frequency_and_presence(self):
        _, lp = greedy_logprobs(self.LOGITS, repetition_penalty=2.0, frequency_penalty=1.0,
                                presence_penalty=-0.5, prompt=[6], output=[6, 4])
        hand = np.array([2.0, -2.0, 0.5, -0.5, 1.0 / 2 - 1 + 0.5, 0.0, 3.0 / 2 - 1 + 0.5])
        np.testing.assert_allclose(lp, log_softmax(hand), atol=1e-5)

    def test_banned_tokens_are_never_chosen(self):
        tok, lp = greedy_logprobs(self.LOGITS, banned=[6, 0])
        assert tok == 4 and lp[6] == -np.inf and lp[0] == -np.inf
        tokens = draw(self.LOGITS, n=2000, banned=[6, 0], temperature=5.0)
        assert not np.isin(tokens, [0, 6]).any()

    def test_penalties_stay_in_their_row_and_leave_the_input_alone(self):
        logits = np.tile(self.LOGITS, (3, 1))
        before = logits.copy()
        batch = make_batch(3, temperature=0.0, num_logprobs=7,
                           repetition_penalty=[1.0, 3.0, 1.0], frequency_penalty=[0.0, 0.0, 2.0],
                           output=[[6], [6], [6]], banned=[None, None, np.array([4])])
        out = sample(logits, batch)
        np.testing.assert_array_equal(logits, before)
        assert out.token_ids.tolist() == [6, 0, 0]  # row 1: 3 / 3 = 1 < 2; row 2: 3 - 2 = 1 < 2
        np.testing.assert_allclose(np.sort(out.top_logprobs[0][1])[::-1],
                                   np.sort(log_softmax(self.LOGITS.astype(np.float64)))[::-1], atol=1e-5)

    def test_token_ids_outside_the_vocabulary_are_refused(self):
        with pytest.raises(ValueError, match="out of range"):
            sample(self.LOGITS[None], make_batch(1, repetition_penalty=1.2, prompt=[7]))


# ---------------------------------------------------------------- greedy


class TestGreedy:
    def test_greedy_rows_take_the_argmax_of_the_penalised_logits(self):
        rng = np.random.default_rng(3)
        logits = rng.standard_normal((40, 500)).astype(np.float32)
        out_tokens = [rng.integers(0, 500, 30) for _ in range(40)]
        batch = make_batch(40, temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.3,
                           output=out_tokens)
        got = sample(logits, batch).token_ids
        want = [np.argmax(ref_penalised(logits[i], (), out_tokens[i], 1.5, 0.3, 0.0)) for i in range(40)]
        assert got.tolist() == want

    def test_greedy_ignores_truncation_and_consumes_no_randomness(self):
        logits = np.array([[0.0, 5.0, 5.0, 1.0]], np.float32)
        gen = make_generator(9)
        state = gen.bit_generator.state
        out = sample(logits, make_batch(1, temperature=0.0, top_k=1, top_p=0.1, generators=[gen]))
        assert out.token_ids[0] == 1  # lowest id among the tied best
        assert gen.bit_generator.state == state

    def test_mixed_batch_greedy_rows_unaffected(self):
        rng = np.random.default_rng(4)
        logits = rng.standard_normal((8, 300)).astype(np.float32)
        temps = np.array([0, 1, 0, 0.5, 0, 2, 0, 0.9], np.float32)
        out = sample(logits, make_batch(8, temperature=temps, top_k=[0, 5, 0, 0, 0, 50, 0, 3]))
        greedy = temps == 0
        np.testing.assert_array_equal(out.token_ids[greedy], logits[greedy].argmax(axis=1))


# ---------------------------------------------------------------- seeds


MIXED = dict(  # 16 rows of different parameters around the seeded row
    temperature=[0.0, 1.0, 0.7, 1.3, 0.0, 0.9, 1.0, 0.5, 1.1, 0.8, 1.0, 0.6, 1.2, 0.0, 1.0, 0.95],
    top_k=[0, 0, 5, 200, 0, 40, 0, 2500, 0, 1, 0, 20, 0, 0, 7, 0],  # 2500: a long top-p prefix
    top_p=[1.0, 0.9, 1.0, 0.8, 1.0, 0.95, 1.0, 0.99, 0.5, 1.0, 1.0, 0.7, 1.0, 1.0, 0.9, 0.3],
    min_p=[0.0, 0.0, 0.1, 0.0, 0.0, 0.05, 0.2, 0.0, 0.0, 0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.5],
    repetition_penalty=[1.0, 1.1, 1.0, 1.0, 1.3, 1.0, 1.0, 1.2, 1.0, 1.0, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0],
    frequency_penalty=[0.0, 0.0, 0.5, 0.0, 0.0, 0.0, -0.4, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3, 0.0, 0.0, 0.0],
    num_logprobs=[-1, 3, 0, -1, 5, -1, 2, -1, 20, -1, 1, -1, 0, 4, -1, 2],
)


@pytest.mark.parametrize("seeded", [
    dict(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0),  # whole-row draw
    dict(temperature=0.9, top_k=10, top_p=0.9, min_p=0.02),  # packed
    dict(temperature=1.2, top_k=0, top_p=0.97, min_p=0.0),  # top-p, maybe past the prefix
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.001),  # min-p keeping many tokens
])
@pytest.mark.parametrize("position", [0, 7, 15])
def test_seeded_row_same_alone_and_in_a_batch(paths, seeded, position):
    vocab, steps = 3000, 12
    rng = np.random.default_rng(11)
    logits = (rng.standard_normal((steps, 16, vocab)) * 2.5).astype(np.float32)
    params = {name: list(vals) for name, vals in MIXED.items()}
    for name, v in seeded.items():
        params[name][position] = v
    params["repetition_penalty"][position] = 1.15
    params["num_logprobs"][position] = 4
    alone_gen, batch_gen = make_generator(2024), make_generator(2024)
    others = [make_generator(100 + i) for i in range(16)]
    history: list[int] = []
    for step in range(steps):
        row = logits[step, position][None]
        one = {name: [vals[position]] for name, vals in params.items()}
        alone = sample(row, make_batch(1, generators=[alone_gen], output=[history], **one))
        gens = list(others)
        gens[position] = batch_gen
        outputs = [rng.integers(0, vocab, step) for _ in range(16)]
        outputs[position] = np.asarray(history, np.int64)
        mixed = sample(logits[step], make_batch(16, generators=gens, output=outputs, **params))
        assert mixed.token_ids[position] == alone.token_ids[0]
        assert mixed.logprobs[position] == alone.logprobs[0]
        np.testing.assert_array_equal(mixed.top_logprobs[position][0], alone.top_logprobs[0][0])
        np.testing.assert_array_equal(mixed.top_logprobs[position][1], alone.top_logprobs[0][1])
        history.append(int(alone.token_ids[0]))
    assert len(set(history)) > 1


def test_same_seed_same_tokens_different_seed_different_tokens():
    logits = (np.random.default_rng(5).standard_normal((64, 800)) * 2).astype(np.float32)
    a = sample(logits, make_batch(64, generators=[make_generator(7)] * 64, top_p=0.95)).token_ids
    b = sample(logits, make_batch(64, generators=[make_generator(7)] * 64, top_p=0.95)).token_ids
    c = sample(logits, make_batch(64, generators=[make_generator(8)] * 64, top_p=0.95)).token_ids
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()


# ---------------------------------------------------------------- logprobs


class TestLogprobs:
    CASES = [
        dict(temperature=0.7),
        dict(temperature=1.0, top_k=4),
        dict(temperature=0.8, top_p=0.6),
        dict(temperature=1.2, min_p=0.2),
        dict(temperature=0.9, top_k=6, top_p=0.8, min_p=0.1, repetition_penalty=1.4,
             frequency_penalty=0.3, presence_penalty=0.2, prompt=[0, 2], output=[1, 1, 11], banned=[3]),
        dict(temperature=0.0, repetition_penalty=1.4, output=[0], banned=[1]),
    ]

    @pytest.mark.parametrize("case", CASES)
    def test_logprobs_are_the_log_softmax_of_the_processed_logits(self, paths, case):
        case = dict(case)
        n = 50
        out = sample(np.tile(LOGITS, (n, 1)), make_batch(n, num_logprobs=20, seed=3, **case))
        x = ref_penalised(LOGITS, case.pop("prompt", ()), case.pop("output", ()),
                          case.pop("repetition_penalty", 1.0), case.pop("frequency_penalty", 0.0),
                          case.pop("presence_penalty", 0.0), case.pop("banned", ()))
        t = case.pop("temperature")
        ref = log_softmax(x) if t == 0 else log_softmax(ref_processed(x, t, **case))
        finite = np.flatnonzero(np.isfinite(ref))
        want_ids = finite[np.lexsort((finite, -ref[finite]))]  # most likely first, then lower id
        for i in range(n):
            tok = out.token_ids[i]
            assert np.isfinite(ref[tok])
            assert out.logprobs[i] == pytest.approx(ref[tok], abs=2e-5)
            ids, lps = out.top_logprobs[i]
            assert ids.tolist() == want_ids.tolist()  # fewer than 20: only what remains
            np.testing.assert_allclose(lps, ref[want_ids], atol=2e-5)
            assert ids.dtype == np.int64 and lps.dtype == np.float32 and (lps <= 0).all()

    def test_top_n_is_cut_to_n_with_ties_by_lower_id(self, paths):
        logits = np.array([1.0, 3.0, 2.0, 3.0, 2.0, 0.0, 2.0], np.float32)
        out = sample(logits[None], make_batch(1, temperature=0.0, num_logprobs=4))
        assert out.top_logprobs[0][0].tolist() == [1, 3, 2, 4]
        assert out.token_ids[0] == 1

    def test_large_vocab_top_n(self, paths):
        rng = np.random.default_rng(8)
        logits = (rng.standard_normal((6, 20000)) * 2).astype(np.float32)
        temps, top_p = [0.0, 0.8, 1.0, 0.0, 1.3, 1.0], [1, 1, 0.999, 1, 1, 1]
        out = sample(logits, make_batch(6, temperature=temps, top_p=top_p,
                                        num_logprobs=[20, 5, 20, 1, 0, -1]))
        for i, n in enumerate([20, 5, 20, 1]):
            ref = log_softmax(ref_processed(logits[i], temps[i] or 1.0, top_p=top_p[i]))
            ids, lps = out.top_logprobs[i]
            assert ids.tolist() == np.argsort(-ref, kind="stable")[:n].tolist()
            np.testing.assert_allclose(lps, ref[ids], atol=5e-5)
            assert out.logprobs[i] == pytest.approx(ref[out.token_ids[i]], abs=5e-5)
        assert out.top_logprobs[4] is None and np.isfinite(out.logprobs[4])
        assert out.top_logprobs[5] is None and np.isnan(out.logprobs[5])

    def test_no_logprobs_asked(self):
        out = sample(np.tile(LOGITS, (3, 1)), make_batch(3, temperature=[0, 1, 0.5]))
        assert np.isnan(out.logprobs).all() and out.top_logprobs == [None] * 3
        assert out.token_ids.dtype == np.int64 and out.logprobs.dtype == np.float32


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
        assert sorted(out.top_logprobs[i][0].tolist()) == kept.tolist()
        assert out.token_ids[i] in kept


def test_rows_with_no_probability_mass_fall_back_to_argmax():
    logits = np.array([[-np.inf, -np.inf, -np.inf]], np.float32)
    out = sample(logits, make_batch(1, temperature=1.0))
    assert 0 <= out.token_ids[0] < 3


def test_batch_size_mismatch_is_refused():
    with pytest.raises(ValueError):
        sample(np.zeros((2, 5), np.float32), make_batch(3))


class TestLogitBias:
    def test_bias_is_added_to_its_rows_tokens_before_everything_else(self):
        logits = np.zeros((3, 8), dtype=np.float32)
        logits[:, 2] = 1.0
        batch = make_batch(3, temperature=0.0, num_logprobs=0, prompt=[[5]] * 3, repetition_penalty=2.0)
        batch.bias_rows = np.array([0, 0, 2], np.int64)
        batch.bias_ids = np.array([5, 2, 7], np.int64)
        batch.bias_values = np.array([3.0, -100.0, 0.5], np.float32)
        out = sample(logits, batch)
        # row 0: token 5 biased to 3, then divided by the repetition penalty -> 1.5 beats nothing else;
        # row 1 untouched -> token 2; row 2: 7 at 0.5 loses to token 2 at 1.
        assert out.token_ids.tolist() == [5, 2, 2]
        assert np.all(logits[:, 2] == 1.0) and not logits[0, 5], "the caller's logits are left alone"

    def test_minus_100_bans_and_plus_100_forces_a_sampled_row(self):
        rng = np.random.default_rng(0)
        logits = rng.normal(0, 1, (2, 64)).astype(np.float32)
        batch = make_batch(2, temperature=1.0, generators=[make_generator(1), make_generator(2)])
        batch.bias_rows = np.array([0, 1], np.int64)
        batch.bias_ids = np.array([9, int(np.argmax(logits[1]))], np.int64)
        batch.bias_values = np.array([100.0, -100.0], np.float32)
        for _ in range(20):
            out = sample(logits, batch)
            assert out.token_ids[0] == 9 and out.token_ids[1] != batch.bias_ids[1]
