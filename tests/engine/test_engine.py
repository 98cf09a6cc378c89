"""Continuous batching: outputs do not depend on batching, chunking, preemption or the prefix cache."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from nvllm import LLM, SamplingParams
from nvllm.engine.assembly.factory import EngineBuildError
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
    assert bm.num_free_blocks == bm.num_backed_blocks, "after every request ends, all backed pages are free or cached"


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
    engine = LLM(model_dir, num_blocks=64, max_num_batched_tokens=16).engine
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
    engine = LLM(model_dir, num_blocks=64).engine
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
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_backed_blocks
    assert not engine.has_unfinished()


def test_request_added_mid_flight_starts_next_step(model_dir):
    engine = LLM(model_dir, num_blocks=64).engine
    engine.add_request("first", list(range(3, 20)), SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    engine.step()
    engine.step()
    engine.add_request("late", list(range(20, 30)), SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    outs = engine.step()
    assert {o.request_id for o in outs} == {"first", "late"}


def test_a_pool_that_cannot_hold_one_full_length_sequence_is_refused(model_dir):
    # So no admitted request can ever need more pages than the pool has.
    with pytest.raises(EngineBuildError, match=r"max_model_len=200 needs 13 blocks.*raise cache.num_blocks to 13"):
        LLM(model_dir, num_blocks=4, max_model_len=200)


def test_request_that_can_never_fit_is_refused_with_the_limit(model_dir):
    engine = LLM(model_dir, num_blocks=13, max_model_len=200).engine
    with pytest.raises(InvalidParameter, match=r"max_tokens.*max_model_len 200 by 10"):
        engine.add_request("x", list(range(3, 13)), SamplingParams(max_tokens=200))
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
    assert s["pages_free"] + s["pages_cached"] + s["pages_used"] == s["pages_backed"] <= 32
    assert s["running"] == 0 and s["waiting"] == 0
    assert s["generated_tokens"] == 36 and s["tokens_per_s"] > 0


def test_chat_requests_given_at_once_compute_their_system_prompt_once(model_dir, kernel_path):
    # Blocks are findable from the step that computes them: the five later requests, admitted in the
    # same step as the first, read its system prompt's K/V instead of computing it again.
    system = "You are a careful assistant for a hardware store. Answer briefly and name the aisle. " * 2
    questions = ["Screws?", "Paint?", "Closing time?", "Ladders?", "Garden?", "Keys?"]
    convs = [[{"role": "system", "content": system}, {"role": "user", "content": q}] for q in questions]
    cold = LLM(model_dir, num_blocks=128, enable_prefix_caching=False)
    warm = LLM(model_dir, num_blocks=128)
    ids = [warm.tokenizer.encode_chat(c) for c in convs]
    shared = next(i for i in range(min(map(len, ids))) if len({x[i] for x in ids}) > 1)
    shared_full = shared // 16 * 16
    assert shared_full >= 4 * 16 and sum(map(len, ids)) > 512, "a long prompt, more than one step's budget"
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    ref = [o.token_ids for o in cold.chat(convs, params)]
    out = warm.chat(convs, params)
    assert [o.token_ids for o in out] == ref
    assert [o.cached_tokens for o in out] == [0] + [shared_full] * 5
    s = warm.stats()
    assert s["prefix_cache_hit_tokens"] >= 5 * shared_full
    assert s["prompt_tokens_computed"] == cold.stats()["prompt_tokens_computed"] - 5 * shared_full
    assert_pool_clean(warm)


def test_a_prompt_whose_prefix_another_computes_in_the_same_step_decodes_from_it(model_dir, kernel_path):
    # The second copy hits all 6 full blocks and computes only its last token, on the decode path,
    # in the very step the first copy writes those blocks.
    prompt = {"prompt_token_ids": np.random.default_rng(3).integers(3, 500, 6 * 16 + 1).tolist()}
    ref = LLM(model_dir, num_blocks=64, enable_prefix_caching=False).generate(prompt, GREEDY)[0].token_ids
    llm = LLM(model_dir, num_blocks=64)
    out = llm.generate([prompt, prompt], GREEDY)
    assert [o.token_ids for o in out] == [ref, ref]
    assert [o.cached_tokens for o in out] == [0, 96]
    s = llm.stats()
    assert s["steps"] == GREEDY.max_tokens, "both were admitted in the first step"
    assert s["prompt_tokens_computed"] == 97 + 1
    assert_pool_clean(llm)


def test_a_failed_step_leaves_no_uncomputed_block_in_the_prefix_cache(model_dir, monkeypatch):
    rng = np.random.default_rng(5)
    system = rng.integers(3, 500, 64).tolist()
    ps = [{"prompt_token_ids": system + rng.integers(3, 500, 6).tolist()} for _ in range(3)]
    ref = [o.token_ids for o in LLM(model_dir, num_blocks=64, enable_prefix_caching=False).generate(ps, GREEDY)]
    llm = LLM(model_dir, num_blocks=64)
    forward = llm.engine.model.forward
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected")
        return forward(*args, **kwargs)

    monkeypatch.setattr(llm.engine.model, "forward", failing_once)
    failed = llm.generate(ps, GREEDY)
    assert [o.finish_reason for o in failed] == ["abort"] * 3
    assert_pool_clean(llm)
    # The blocks registered for the failed step were never written: nothing may hit them now.
    out = llm.generate(ps, GREEDY)
    assert [o.token_ids for o in out] == ref
    assert [o.cached_tokens for o in out] == [0, 64, 64]
    assert_pool_clean(llm)


def test_a_failed_step_logs_each_request_by_its_id(model_dir, monkeypatch, caplog):
    llm = LLM(model_dir, num_blocks=64)
    engine = llm.engine

    def broken(*args, **kwargs):
        raise RuntimeError("the model broke")
    monkeypatch.setattr(engine.model, "forward", broken)
    for rid in ("a", "b"):
        engine.add_request(rid, [5, 6, 7], SamplingParams(max_tokens=2))
    with caplog.at_level("ERROR", logger="nvllm.engine"):
        outs = engine.step()
    assert {o.request_id: o.finish_reason for o in outs} == {"a": "abort", "b": "abort"}
    assert all("the model broke" in o.error for o in outs)
    named = [r for r in caplog.records if getattr(r, "request_id", None) in ("a", "b")]
    assert sorted(r.request_id for r in named) == ["a", "b"]
    assert all("the model broke" in r.getMessage() for r in named)


def test_text_the_model_has_no_token_for_is_refused_naming_the_field(model_dir, tmp_path):
    """A tokenizer with more tokens than the model's vocabulary (a mismatched folder) gives a clear refusal,
    not an IndexError in the step."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as Backend

    folder = tmp_path / "mismatched"
    shutil.copytree(model_dir, folder)
    backend = Backend.from_file(str(folder / "tokenizer.json"))
    backend.add_tokens([AddedToken("<beyond>", special=False, normalized=False)])
    backend.save(str(folder / "tokenizer.json"))
    llm = LLM(str(folder), num_blocks=64)
    for prompt, field in (("a <beyond> b", "prompt"), ({"messages": [{"role": "user", "content": "<beyond>"}]},
                                                        "messages")):
        with pytest.raises(InvalidParameter) as e:
            llm.generate([prompt], SamplingParams(max_tokens=2))
        assert e.value.field == field and "vocabulary" in str(e.value)
    assert llm.generate(["a b"], SamplingParams(max_tokens=2))[0].token_ids   # the engine still serves


def test_logit_bias_forces_and_bans_tokens_per_request(model_dir):
    llm = LLM(model_dir, num_blocks=64)
    p = {"prompt_token_ids": [5, 6, 7]}
    free = llm.generate(p, GREEDY)[0].token_ids
    forced, banned, other = llm.generate([p, p, p], [
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logit_bias={9: 100.0}),
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logit_bias={t: -100.0 for t in set(free)}),
        GREEDY])
    assert forced.token_ids == [9] * 12
    assert not set(banned.token_ids) & set(free)
    assert other.token_ids == free, "a biased row leaves the others in its batch alone"


def test_the_first_tokens_output_says_how_long_it_queued_and_prefilled(model_dir):
    # the engine times each request's wait for a seat and its prefill (chunked here: a 120-token prompt on
    # a budget of 32), and hands both out once, on the output with its first token
    llm = LLM(model_dir, num_blocks=64, max_num_seqs=1, max_num_batched_tokens=32)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    engine.add_request("first", list(range(10, 130)), params)
    engine.add_request("second", list(range(20, 60)), params)   # waits for the one seat
    outs: dict[str, list] = {"first": [], "second": []}
    while engine.has_unfinished():
        for o in engine.step():
            outs[o.request_id].append(o)
    for rid, got in outs.items():
        timed = [o for o in got if o.prefill_s is not None]
        assert len(timed) == 1 and timed[0].token_ids, rid
        assert timed[0] is next(o for o in got if o.token_ids), rid   # the output with the first token
        assert timed[0].prefill_s > 0 and timed[0].queued_s >= 0, rid
        assert all(o.queued_s is None for o in got if o is not timed[0]), rid
    first = next(o for o in outs["first"] if o.prefill_s is not None)
    second = next(o for o in outs["second"] if o.prefill_s is not None)
    assert second.queued_s > first.queued_s   # it waited for the first request to finish
