"""The sampler's logprobs: the log-softmax of the processed logits (penalised, then truncated unless greedy)
for the chosen token and the top n, most likely first with ties by lower id, cut to n or to what truncation
leaves; on a large vocabulary too; none when none are asked. All but the last run with the production
constants and again with tiny ones that force the other code paths (helpers/sampler_cases.py)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.sampler_cases import (
    LOGITS,
    log_softmax,
    make_batch,
    ref_penalised,
    ref_processed,
    top_logprobs,
)
from nvllm.model.sampling.sampler import sample


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
            ids, lps = top_logprobs(out, i)
            assert ids.tolist() == want_ids.tolist()  # fewer than 20: only what remains
            np.testing.assert_allclose(lps, ref[want_ids], atol=2e-5)
            assert ids.dtype == np.int64 and lps.dtype == np.float32 and (lps <= 0).all()

    def test_top_n_is_cut_to_n_with_ties_by_lower_id(self, paths):
        logits = np.array([1.0, 3.0, 2.0, 3.0, 2.0, 0.0, 2.0], np.float32)
        out = sample(logits[None], make_batch(1, temperature=0.0, num_logprobs=4))
        assert top_logprobs(out, 0)[0].tolist() == [1, 3, 2, 4]
        assert out.token_ids[0] == 1

    def test_large_vocab_top_n(self, paths):
        rng = np.random.default_rng(8)
        logits = (rng.standard_normal((6, 20000)) * 2).astype(np.float32)
        temps, top_p = [0.0, 0.8, 1.0, 0.0, 1.3, 1.0], [1, 1, 0.999, 1, 1, 1]
        out = sample(logits, make_batch(6, temperature=temps, top_p=top_p,
                                        num_logprobs=[20, 5, 20, 1, 0, -1]))
        for i, n in enumerate([20, 5, 20, 1]):
            ref = log_softmax(ref_processed(logits[i], temps[i] or 1.0, top_p=top_p[i]))
            ids, lps = top_logprobs(out, i)
            assert ids.tolist() == np.argsort(-ref, kind="stable")[:n].tolist()
            np.testing.assert_allclose(lps, ref[ids], atol=5e-5)
            assert out.logprobs[i] == pytest.approx(ref[out.token_ids[i]], abs=5e-5)
        assert out.top_logprobs[4] is None and np.isfinite(out.logprobs[4])
        assert out.top_logprobs[5] is None and np.isnan(out.logprobs[5])

    def test_no_logprobs_asked(self):
        out = sample(np.tile(LOGITS, (3, 1)), make_batch(3, temperature=[0, 1, 0.5]))
        assert np.isnan(out.logprobs).all() and out.top_logprobs == [None] * 3
        assert out.token_ids.dtype == np.int64 and out.logprobs.dtype == np.float32
