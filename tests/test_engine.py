"""Continuous batching: outputs do not depend on batching, chunking, preemption or the prefix cache."""

from __future__ import annotations

import numpy as np
import pytest

from nvllm import LLM, SamplingParams
from nvllm.engine.llm_engine import EngineConfig, LLMEngine
from nvllm.sampling_params import InvalidParameter

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 90) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"prompt_token_ids": rng.integers(3, 500, rng.integers(lo, hi)).tolist()} for _ in range(n)]


@pytest.fixture(scope="module")
def model_dir(tiny_models):
    return tiny_models["tiny-llama"]


@pytest.fixture(scope="module")
def alone(model_dir):
    """Each of 32 prompts run alone: the reference every batched run must reproduce."""
    llm = LLM(model_dir, num_blocks=64, max_num_seqs=1)
    return [llm.generate(p, GREEDY)[0].token_ids for p in prompts(32)]


def assert_pool_clean(llm: LLM) -> None:
    bm = llm.engine.block_manager
    bm.check_integrity([])
    assert bm.num_free_blocks == bm.num_blocks, "after every request ends, all pages are free or cached"


def test_batched_greedy_equals_alone(model_dir, alone):
    llm = LLM(model_dir, num_blocks=256, max_num_seqs=32)
    out = llm.generate(prompts(32), GREEDY)
    assert [o.token_ids for o in out] == alone
    assert all(o.finish_reason == "length" and o.completion_tokens == 12 for o in out)
    assert_pool_clean(llm)


def test_preemption_keeps_outputs_identical(model_dir, alone):
    llm = LLM(model_dir, num_blocks=24, max_num_seqs=32, enable_prefix_caching=False)
    out = llm.generate(prompts(32), GREEDY)
    assert llm.stats()["preemptions"] > 0, "the pool was meant to be small enough to preempt"
    assert [o.token_ids for o in out] == alone
    assert_pool_clean(llm)


def test_chunked_prefill_keeps_outputs_identical(model_dir, alone):
    llm = LLM(model_dir, num_blocks=256, max_num_seqs=32, max_num_batched_tokens=16)
    out = llm.generate(prompts(32), GREEDY)
    assert [o.token_ids for o in out] == alone
    assert_pool_clean(llm)


def test_chunked_prefill_never_starves_decodes(model_dir):
    engine = LLMEngine.from_dir(model_dir, EngineConfig(num_blocks=64, max_num_batched_tokens=16))
    plans = []
    schedule = engine.scheduler.schedule

    def recording_schedule():
        batch = schedule()
        plans.append([(s.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)])
        return batch

    engine.scheduler.schedule = recording_schedule
    engine.add_request("short", [5, 6, 7], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    engine.step()
    engine.add_request("long", list(range(10, 130)), GREEDY)
    while engine.has_unfinished():
        engine.step()
    # While the 120-token prompt is prefilled in chunks, every step still decodes "short" and
    # gives the prompt exactly what is left of the 16-token budget: one forward pass for both.
    prefill_steps = [p for p in plans[1:] if any(r == "long" and n > 1 for r, n in p)]
    assert len(prefill_steps) == 8
    for p in prefill_steps:
        assert p[0] == ("short", 1) and p[1] == ("long", 15)


def test_shared_system_prompt_hits_prefix_cache(model_dir):
    rng = np.random.default_rng(7)
    system = rng.integers(3, 500, 96).tolist()
    ps = [{"prompt_token_ids": system + rng.integers(3, 500, 5).tolist()} for _ in range(16)]
    cold = LLM(model_dir, num_blocks=256, enable_prefix_caching=False)
    ref = [o.token_ids for o in cold.generate(ps, GREEDY)]
    warm = LLM(model_dir, num_blocks=256)
    first = warm.generate(ps[:1], GREEDY)
    rest = warm.generate(ps[1:], GREEDY)
    assert [o.token_ids for o in first + rest] == ref
    assert first[0].cached_tokens == 0
    assert all(o.cached_tokens == 96 for o in rest), [o.cached_tokens for o in rest]
    s = warm.stats()
    assert s["prefix_cache_hit_tokens"] == 15 * 96
    # The cache saved exactly the shared tokens of the 15 later prompts.
    assert s["prompt_tokens_computed"] == cold.stats()["prompt_tokens_computed"] - 15 * 96
    assert_pool_clean(warm)


def test_abort_frees_pages_at_once(model_dir):
    engine = LLMEngine.from_dir(model_dir, EngineConfig(num_blocks=64))
    engine.add_request("a", list(range(3, 40)), SamplingParams(temperature=0, max_tokens=50))
    engine.add_request("b", list(range(50, 70)), SamplingParams(temperature=0, max_tokens=50))
    engine.step()
    used = engine.block_manager.num_used_blocks
    assert used > 0
    assert engine.abort_request("a")
    assert engine.block_manager.num_used_blocks < used
    outs = engine.step()
    aborted = [o for o in outs if o.request_id == "a"]
    assert aborted and aborted[0].finished and aborted[0].finish_reason == "abort"
    engine.abort_request("b")
    engine.step()
    engine.block_manager.check_integrity([])
    assert engine.block_manager.num_free_blocks == 64
    assert not engine.has_unfinished()


def test_request_added_mid_flight_starts_next_step(model_dir):
    engine = LLMEngine.from_dir(model_dir, EngineConfig(num_blocks=64))
    engine.add_request("first", list(range(3, 20)), SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    engine.step()
    engine.step()
    engine.add_request("late", list(range(20, 30)), SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    outs = engine.step()
    assert {o.request_id for o in outs} == {"first", "late"}


def test_request_that_can_never_fit_is_refused_with_the_limit(model_dir):
    engine = LLMEngine.from_dir(model_dir, EngineConfig(num_blocks=4, max_model_len=200))
    with pytest.raises(InvalidParameter, match=r"max_tokens.*max_model_len 200 by 10"):
        engine.add_request("x", list(range(3, 13)), SamplingParams(max_tokens=200))
    with pytest.raises(InvalidParameter, match=r"need 5 pages, the pool holds 4 \(short by 1\)"):
        engine.add_request("y", list(range(3, 13)), SamplingParams(max_tokens=70))
    with pytest.raises(InvalidParameter, match=r"prompt_token_ids.*shorter than max_model_len"):
        engine.add_request("z", [5] * 200, SamplingParams(max_tokens=1))
    with pytest.raises(InvalidParameter, match="prompt_token_ids must be non-empty"):
        engine.add_request("e", [], SamplingParams(max_tokens=1))
    assert not engine.has_unfinished()


def test_stats_report_pages_and_counts(model_dir):
    llm = LLM(model_dir, num_blocks=32)
    llm.generate(prompts(3), GREEDY)
    s = llm.stats()
    assert s["pages_total"] == 32
    assert s["pages_free"] + s["pages_cached"] + s["pages_used"] == 32
    assert s["running"] == 0 and s["waiting"] == 0
    assert s["generated_tokens"] == 36 and s["tokens_per_s"] > 0
