"""Draft-model speculation (engine/speculation/draft_proposer.py): a model sharing the target's tokenizer proposes
greedily, the target verifies as for n-gram proposals, and the output is unchanged (greedy, seeded
sampling with penalties, logprobs and stop strings, structured output, preemption); the draft's own
pool gives every page back; a draft with another tokenizer, or none at all, is refused at build; a
failing draft fails no request."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers.engines import backed_engine
from helpers.speculation import PROMPTS, run, tokens
from nvllm import SamplingParams
from nvllm.config import ConfigError, load_settings
from nvllm.engine.assembly.factory import EngineBuildError
from nvllm.engine.llm_engine import LLMEngine

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


def engine(model: Path, draft: Path | None, num_blocks: int = 256, max_model_len: int = 256,
           **speculative) -> LLMEngine:
    spec = {"method": "none"} if draft is None else {"method": "draft", "draft_model": str(draft)}
    return backed_engine(load_settings(overrides={
        "model": {"path": str(model)}, "cache": {"num_blocks": num_blocks, "block_size": 16},
        "scheduler": {"max_model_len": max_model_len, "max_num_seqs": 32},
        "speculative": {**spec, "adaptive": False, **speculative}}))


def draft_run(eng: LLMEngine, prompts: list[list[int]], params) -> dict[str, list]:
    """run(), then the draft's books: every page of its pool free once all requests ended."""
    outs = run(eng, prompts, params)
    drafter = eng.speculator.drafter
    assert drafter is not None and not drafter.states
    assert drafter.num_free_blocks == drafter.kv_cache.num_blocks
    return outs


def test_a_model_drafting_for_itself_is_always_right_under_greedy(tiny):
    eng = engine(tiny, tiny)
    assert tokens(draft_run(eng, PROMPTS, GREEDY)) == tokens(run(engine(tiny, None), PROMPTS, GREEDY))
    st = eng.stats()
    assert st["spec_method"] == "draft" and st["spec_draft_tokens"] > 0
    assert st["spec_accepted_tokens"] == st["spec_draft_tokens"]


def test_another_draft_of_the_same_tokenizer_changes_no_token(tiny_models):
    target, draft = tiny_models["tiny-llama"], tiny_models["tiny-llama-f16"]
    eng = engine(target, draft)
    assert tokens(draft_run(eng, PROMPTS, GREEDY)) == tokens(run(engine(target, None), PROMPTS, GREEDY))
    st = eng.stats()
    assert st["spec_draft_tokens"] > st["spec_accepted_tokens"] > 0


def test_seeded_sampling_with_penalties_logprobs_and_stops_draws_the_same_tokens(tiny):
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=40, ignore_eos=True, logprobs=3),
        SamplingParams(temperature=1.0, top_k=5, seed=2, max_tokens=40, ignore_eos=True,
                       repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2),
        SamplingParams(temperature=0.7, seed=3, max_tokens=40, min_tokens=30, logit_bias={31: 3.0}),
        SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[57], logprobs=2),
    ]
    text = "".join(o.text for o in run(engine(tiny, None), PROMPTS[:1], GREEDY)["r0"])
    params.append(SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                 stop=[text[len(text) // 2:len(text) // 2 + 3]]))
    prompts = PROMPTS + PROMPTS[:1]
    a = draft_run(engine(tiny, tiny, disable_by_batch_size=5), prompts, params)
    b = run(engine(tiny, None), prompts, params)
    assert tokens(a) == tokens(b)
    for rid in a:
        la, lb = ([(lp.token_id, [t.token_id for t in lp.top]) for o in outs[rid] for lp in o.logprobs or ()]
                  for outs in (a, b))
        assert la == lb
        assert a[rid][-1].finish_reason == b[rid][-1].finish_reason
        assert "".join(o.text for o in a[rid]) == "".join(o.text for o in b[rid])


def test_structured_output_cuts_the_drafts_to_what_the_grammar_allows(tiny):
    params = SamplingParams(temperature=0.9, seed=5, max_tokens=60, structured={"regex": "(ab|cd){3,12}x"})
    a, b = draft_run(engine(tiny, tiny), PROMPTS, params), run(engine(tiny, None), PROMPTS, params)
    assert tokens(a) == tokens(b)
    assert all(outs[-1].finish_reason == "stop" for outs in a.values())


def test_a_small_pool_preempts_and_neither_pool_leaks(tiny):
    greedy = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    prompts = PROMPTS + [PROMPTS[0] + [1, 2], PROMPTS[0] + [3]]
    small = engine(tiny, tiny, num_blocks=14, max_model_len=128, disable_by_batch_size=8)
    assert tokens(draft_run(small, prompts, greedy)) == tokens(run(engine(tiny, None), prompts, greedy))
    st = small.stats()
    assert st["preemptions"] > 0 and st["spec_accepted_tokens"] > 0


def test_an_aborted_request_gives_its_draft_pages_back(tiny):
    eng = engine(tiny, tiny)
    eng.add_request("a", {"prompt_token_ids": PROMPTS[0]}, GREEDY)
    for _ in range(4):
        eng.step()
    drafter = eng.speculator.drafter
    assert drafter is not None and drafter.num_free_blocks < drafter.kv_cache.num_blocks
    eng.abort_request("a")
    eng.step()
    assert drafter.num_free_blocks == drafter.kv_cache.num_blocks


def test_a_failing_draft_proposes_nothing_and_fails_no_request(tiny, monkeypatch, caplog):
    eng = engine(tiny, tiny)
    drafter = eng.speculator.drafter
    assert drafter is not None

    def broken(*_a, **_k):
        raise RuntimeError("draft broke")
    monkeypatch.setattr(drafter.model, "forward", broken)
    outs = run(eng, PROMPTS, GREEDY)
    assert tokens(outs) == tokens(run(engine(tiny, None), PROMPTS, GREEDY))
    assert all(o[-1].error is None for o in outs.values())
    assert eng.stats()["spec_draft_tokens"] == 0 and drafter.num_failures > 0
    assert sum("draft model failed" in r.message for r in caplog.records) == 1   # logged once


def test_a_draft_with_another_tokenizer_is_refused_at_build(tiny_models):
    # tiny-qwen2 has tiny-llama's vocabulary size (512) but other token strings.
    with pytest.raises(EngineBuildError, match=r"speculative\.draft_model.*token \d+ is .*tokenizer"):
        engine(tiny_models["tiny-llama"], tiny_models["tiny-qwen2"])
    with pytest.raises(EngineBuildError, match=r"speculative\.draft_model.*no model at"):
        engine(tiny_models["tiny-llama"], Path("/nonexistent/draft"))


def test_method_draft_needs_a_draft_model():
    with pytest.raises(ConfigError, match=r"speculative\.draft_model"):
        load_settings(overrides={"speculative": {"method": "draft"}})


def test_the_adaptive_cut_comes_before_drafting_and_changes_no_token(tiny):
    eng = engine(tiny, tiny, adaptive=True)
    assert tokens(draft_run(eng, PROMPTS, GREEDY)) == tokens(run(engine(tiny, None), PROMPTS, GREEDY))
    st = eng.stats()
    assert st["spec_drafts"] > 0 and st["spec_accepted_tokens"] == st["spec_draft_tokens"]


def test_proposals_stop_at_max_model_len(tiny):
    # max_model_len (below the draft's own 256 positions) bounds the draft's pool; every request reaches it.
    params = SamplingParams(temperature=0, ignore_eos=True)
    prompts = [p[:20] for p in PROMPTS]
    eng = engine(tiny, tiny, max_model_len=64)
    assert eng.speculator.drafter is not None and eng.speculator.drafter.max_len == 64
    outs = draft_run(eng, prompts, params)
    assert tokens(outs) == tokens(run(engine(tiny, None, max_model_len=64), prompts, params))
    assert all(o[-1].finish_reason == "length" and o[-1].error is None for o in outs.values())
    assert all(len(p) + len(t) == 64 for p, t in zip(prompts, tokens(outs).values()))


def test_the_drafts_pool_is_taken_off_the_memory_the_targets_pool_is_sized_from(tiny):
    from nvllm.engine.assembly.factory import load_model, plan_pool
    from nvllm.engine.assembly.memory import MemoryReading
    settings = load_settings(overrides={"model": {"path": str(tiny)}, "scheduler": {"max_model_len": 256},
                                        "cache": {"max_pool_mb": 0},
                                        "speculative": {"method": "draft", "draft_model": str(tiny)}})
    loaded = load_model(settings)
    assert loaded.draft is not None
    # 4 sequences of 256 positions, 16 per block: 64 blocks of the draft's f32 keys and values
    assert loaded.info.draft_pool_bytes == 64 * 16 * loaded.draft.info.bytes_per_token
    reading = MemoryReading(2 << 30, "test")
    sizing = plan_pool(settings, loaded.info, reading).sizing
    assert sizing.available_bytes == reading.available_bytes - loaded.info.draft_pool_bytes
    assert "less the draft's pool" in sizing.source
