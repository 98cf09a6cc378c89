"""A model that makes NaN or inf fails the step's requests cleanly (finish_reason "abort", an error that
says why) and the engine goes on: the model checks its logits, the engine fails only that step.
On the C kernels and on the NumPy paths."""

from __future__ import annotations

import numpy as np
import pytest

from nvllm import LLM, SamplingParams
from nvllm.model.decoder import ForwardBatch, NonFiniteLogits
from nvllm.model.matrix.dense import DenseWeight

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def ids(n: int, seed: int) -> dict:
    return {"prompt_token_ids": np.random.default_rng(seed).integers(3, 500, n).tolist()}


def run_until_done(engine) -> dict:
    """request id -> its last output."""
    last = {}
    while engine.has_unfinished():
        for out in engine.step():
            last[out.request_id] = out
    return last


def test_a_nan_weight_fails_the_steps_requests_and_a_repaired_model_serves_again(tiny, kernel_path):
    # A small pool, filled by the failed requests, so the later ones reuse their pages (which still
    # hold NaN keys and values) and must not read them; and prompts of different lengths, so the
    # shorter one's page and table padding lie past its context.
    later = [ids(5, 10), ids(37, 11), ids(20, 12)]
    llm = LLM(tiny, num_blocks=16, max_num_batched_tokens=512)
    expected = [o.token_ids for o in llm.generate(later, GREEDY)]
    engine = llm.engine
    layer = engine.model.weights.layers[0]
    healthy = layer.down
    poisoned = DenseWeight(healthy.dequantize().copy())
    poisoned.array[0, 0] = np.nan                 # reaches every token of every sequence
    layer.down = poisoned
    try:
        for i, n in enumerate((60, 90, 40)):
            engine.add_request(f"bad-{i}", ids(n, i)["prompt_token_ids"], GREEDY)
        first = engine.step()                     # all three prompts in one step: it fails
        assert sorted(o.request_id for o in first) == ["bad-0", "bad-1", "bad-2"]
        for out in first:
            assert out.finish_reason == "abort"
            assert out.error is not None and "NonFiniteLogits" in out.error
            assert "non-finite logits" in out.error
            assert out.token_ids == []
        assert not engine.has_unfinished()
    finally:
        layer.down = healthy
    engine.block_manager.check_integrity([])
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_backed_blocks
    out = llm.generate(later, GREEDY)
    assert [o.error for o in out] == [None] * 3
    assert [o.token_ids for o in out] == expected


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy's word for inf * 0
def test_a_decode_step_that_goes_non_finite_fails_only_its_requests(tiny, kernel_path):
    llm = LLM(tiny, num_blocks=32)
    engine = llm.engine
    engine.add_request("a", ids(9, 1)["prompt_token_ids"], GREEDY)
    engine.add_request("b", ids(30, 2)["prompt_token_ids"], GREEDY)
    outs = engine.step()                          # prefill: both get their first token
    assert [o.error for o in outs] == [None, None]
    w = engine.model.weights
    healthy = w.norm
    w.norm = np.full_like(healthy, np.inf)        # inf * 0 somewhere: NaN logits
    try:
        outs = engine.step()
    finally:
        w.norm = healthy
    assert {o.request_id: o.finish_reason for o in outs} == {"a": "abort", "b": "abort"}
    assert all("non-finite logits" in o.error for o in outs)
    assert not engine.has_unfinished()
    engine.add_request("c", ids(12, 3)["prompt_token_ids"], GREEDY)
    done = run_until_done(engine)
    assert done["c"].finish_reason == "length" and done["c"].error is None


def test_forward_names_the_rows_whose_logits_are_not_finite(tiny, kernel_path):
    llm = LLM(tiny, num_blocks=16)
    model = llm.engine.model
    cache = model.make_kv_cache(4, 16)
    embed = DenseWeight(model.weights.embed.dequantize().copy())
    embed.array[7] = np.nan                       # only token 7: only the sequence that holds it
    # Three sequences of 3, 1 and 2 tokens on pages 0, 1 and 2; token 7 is in the second.
    batch = ForwardBatch.build(token_ids=np.array([5, 6, 8, 7, 9, 10]), positions=np.array([0, 1, 2, 0, 0, 1]),
                               slot_mapping=np.array([0, 1, 2, 16, 32, 33]), query_lens=np.array([3, 1, 2]),
                               context_lens=np.array([3, 1, 2]), block_tables=np.array([[0], [1], [2]]),
                               logits_indices=np.array([2, 3, 5]))
    healthy = model.weights.embed
    model.weights.embed = embed
    try:
        with pytest.raises(NonFiniteLogits, match=r"non-finite logits \(NaN or inf\) in row\(s\) 1 of 3") as e:
            model.forward(batch, cache)
    finally:
        model.weights.embed = healthy
    assert e.value.rows == [1]
    assert isinstance(e.value, RuntimeError)
    logits = model.forward(batch, cache)
    assert logits.shape == (3, model.config.vocab_size) and np.isfinite(logits).all()
