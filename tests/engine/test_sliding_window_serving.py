"""A sliding-window model (tiny-gemma3: window 8, one global layer and five sliding ones, so six groups of
one layer each: model/kv_layout.py) served with the prefix cache, chunked prefill and preemption: each
greedy answer is the one its prompt gets alone, and the one it gets from a pool that keeps every page;
the sliding groups give back the pages behind their window as the sequence goes on."""

from __future__ import annotations

import numpy as np

from nvllm import LLM, SamplingParams
from nvllm.model.kv_layout import KVLayout

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def prompts() -> list[dict]:
    rng = np.random.default_rng(8)
    shared = rng.integers(3, 500, 40).tolist()   # longer than the window and than two pages
    return [{"prompt_token_ids": shared + rng.integers(3, 500, int(rng.integers(1, 30))).tolist()}
            for _ in range(12)]


def test_the_layout_groups_gemmas_layers_by_kind():
    layout = KVLayout.of_windows([512] * 5 + [0] + [512] * 5 + [0] + [512] * 5 + [0])   # 270m's pattern
    assert layout.windows == (0, 512, 512, 512, 512, 512) and layout.slots == 3
    assert [layout.layer_group[i] for i in (5, 11, 17)] == [0, 0, 0]
    assert len({(layout.layer_group[i], layout.layer_slot[i]) for i in range(18)}) == 18   # each its own
    assert KVLayout.of_windows([0] * 4) == KVLayout.single(4)
    one_kind = KVLayout.of_windows([2047] * 3)   # Phi-3: every layer sliding, one group that gives back
    assert one_kind.windows == (2047,) and one_kind.slots == 3


def test_prefix_cache_chunking_and_preemption_keep_answers(tiny_models):
    path = tiny_models["tiny-gemma3"]
    alone_llm = LLM(path, num_blocks=256, max_num_seqs=1, enable_prefix_caching=False, hybrid_kv_cache=False)
    alone = [alone_llm.generate(p, GREEDY)[0].token_ids for p in prompts()]
    llm = LLM(path, num_blocks=48, max_num_seqs=12, max_num_batched_tokens=24, max_model_len=128)
    assert llm.engine.kv_cache.layout.num_groups == 6
    out = llm.generate(prompts(), GREEDY)
    assert llm.stats()["preemptions"] > 0, "the pool was meant to be small enough to preempt"
    assert [o.token_ids for o in out] == alone
    again = llm.generate(prompts()[:3], GREEDY)   # the shared prefix's pages now come from the cache
    assert [o.token_ids for o in again] == alone[:3]
    assert llm.stats()["prefix_cache_hit_tokens"] > 0
    bm = llm.engine.block_manager
    bm.check_integrity([])
    assert bm.num_used_blocks == 0


def test_sliding_groups_hold_only_their_window(tiny_models):
    """A 100-token prompt sampling 40 tokens: at every step each sliding group holds the pages from its
    window's first on (the null page before), the global group every page, and the answer is the one a
    pool of one group that keeps every page gives."""
    path = tiny_models["tiny-gemma3"]
    prompt = np.random.default_rng(3).integers(3, 500, 100).tolist()
    # Sampled, not greedy: a change in the logits shows in the tokens.
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=40, ignore_eos=True)
    kept = LLM(path, num_blocks=64, max_num_batched_tokens=32, hybrid_kv_cache=False)
    assert kept.engine.kv_cache.layout.num_groups == 1
    want = kept.generate({"prompt_token_ids": prompt}, params)[0].token_ids
    engine = LLM(path, num_blocks=64, max_num_batched_tokens=32).engine
    bm, bs = engine.block_manager, engine.kv_cache.block_size
    engine.add_request("long", prompt, params)
    seq = engine.seqs["long"]
    held = []
    while engine.has_unfinished():
        outputs = engine.step()
        if engine.has_unfinished():
            n = seq.num_computed_tokens
            first = max(0, n - 8 + 1) // bs
            for g, table in enumerate(seq.block_tables):
                assert len(table) == len(seq.block_tables[0]) >= -(-n // bs)
                if g == 0:
                    assert bm.null not in table
                else:
                    assert table[:first] == [bm.null] * first and bm.null not in table[first:]
            held.append(bm.num_used_blocks)
            bm.check_integrity([seq])
    assert outputs[0].finished and seq.token_ids[len(prompt):] == want
    # At the end 140 tokens: the global group's 9 pages, each sliding group's last one or two.
    assert max(held[-5:]) <= 9 + 5 * 2, held
    assert bm.num_used_blocks == 0
