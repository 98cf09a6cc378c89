"""The sampler's seeds and batches: a seeded row draws the same tokens and logprobs alone and at any position
of a batch of rows with other parameters and their own generators, step after step; the same seed gives the
same tokens and another seed others; a batch that does not match the logits is refused. The seeded-row test
runs with the production constants and again with tiny ones that force the other code paths
(helpers/sampler_cases.py)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.sampler_cases import make_batch, top_logprobs
from nvllm.model.sampling.sampler import make_generator, sample

MIXED: dict[str, list[float]] = dict(  # 16 rows of different parameters around the seeded row
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
        np.testing.assert_array_equal(top_logprobs(mixed, position)[0], top_logprobs(alone, 0)[0])
        np.testing.assert_array_equal(top_logprobs(mixed, position)[1], top_logprobs(alone, 0)[1])
        history.append(int(alone.token_ids[0]))
    assert len(set(history)) > 1


def test_same_seed_same_tokens_different_seed_different_tokens():
    logits = (np.random.default_rng(5).standard_normal((64, 800)) * 2).astype(np.float32)
    a = sample(logits, make_batch(64, generators=[make_generator(7)] * 64, top_p=0.95)).token_ids
    b = sample(logits, make_batch(64, generators=[make_generator(7)] * 64, top_p=0.95)).token_ids
    c = sample(logits, make_batch(64, generators=[make_generator(8)] * 64, top_p=0.95)).token_ids
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()


def test_batch_size_mismatch_is_refused():
    with pytest.raises(ValueError):
        sample(np.zeros((2, 5), np.float32), make_batch(3))
