"""The sampler's penalties and logit bias, read back through exact logprobs: repetition divides positive logits
and multiplies negative ones, frequency and presence count the output only and come after it, banned tokens are
never chosen, each row keeps its own and the caller's logits are left alone; logit_bias before everything else;
and greedy rows take the argmax of the penalised logits, ignoring truncation and consuming no randomness."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.sampler_cases import draw, log_softmax, make_batch, ref_penalised, top_logprobs
from nvllm.model.sampling.sampler import make_generator, sample


def greedy_logprobs(logits, **params):
    """The full penalised log-softmax, read back through a greedy row asking for every token."""
    v = len(logits)
    out = sample(np.asarray(logits, np.float32)[None], make_batch(1, temperature=0.0,
                                                                 num_logprobs=v, **params))
    ids, lps = top_logprobs(out, 0)
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
        np.testing.assert_allclose(np.sort(top_logprobs(out, 0)[1])[::-1],
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


# ---------------------------------------------------------------- logit bias


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
