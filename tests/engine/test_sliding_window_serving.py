"""A sliding-window model (tiny-gemma3, window 8) served with the prefix cache, chunked prefill and
preemption: each greedy answer is the one its prompt gets alone, as for the full-attention models
(attention only masks the keys before the window; the pages stay, so nothing else needs to know)."""

from __future__ import annotations

import numpy as np

from nvllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def prompts() -> list[dict]:
    rng = np.random.default_rng(8)
    shared = rng.integers(3, 500, 40).tolist()   # longer than the window and than two pages
    return [{"prompt_token_ids": shared + rng.integers(3, 500, int(rng.integers(1, 30))).tolist()}
            for _ in range(12)]


def test_prefix_cache_chunking_and_preemption_keep_answers(tiny_models):
    path = tiny_models["tiny-gemma3"]
    alone_llm = LLM(path, num_blocks=64, max_num_seqs=1, enable_prefix_caching=False)
    alone = [alone_llm.generate(p, GREEDY)[0].token_ids for p in prompts()]
    llm = LLM(path, num_blocks=14, max_num_seqs=12, max_num_batched_tokens=24, max_model_len=128)
    out = llm.generate(prompts(), GREEDY)
    assert llm.stats()["preemptions"] > 0, "the pool was meant to be small enough to preempt"
    assert [o.token_ids for o in out] == alone
    again = llm.generate(prompts()[:3], GREEDY)   # the shared prefix's pages now come from the cache
    assert [o.token_ids for o in again] == alone[:3]
    bm = llm.engine.block_manager
    bm.check_integrity([])
    assert bm.num_free_blocks == bm.num_backed_blocks
