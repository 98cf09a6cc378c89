"""Speculative decoding through the engine (engine/speculation/: speculator.py, ngram.py): proposals from the
sequence's own tokens verified as decode rows in one pass, output unchanged (greedy, seeded sampling
with every sampling parameter, structured output, logprobs, stop strings, length limits), pages given
back and the books true through preemption and the prefix cache, the distribution unchanged when
unseeded, and the rules for when it speculates at all."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from helpers.engines import backed_engine
from helpers.speculation import PROMPTS, run, tokens
from nvllm import SamplingParams
from nvllm.config import ConfigError, load_settings
from nvllm.engine.llm_engine import LLMEngine
from nvllm.engine.speculation import ngram
from nvllm.llm import LLM


def engine(model: Path, method: str = "ngram", num_blocks: int = 256, max_num_seqs: int = 32,
           max_model_len: int = 256, **speculative) -> LLMEngine:
    return backed_engine(load_settings(overrides={
        "model": {"path": str(model)}, "cache": {"num_blocks": num_blocks, "block_size": 16},
        "scheduler": {"max_model_len": max_model_len, "max_num_seqs": max_num_seqs},
        "speculative": {"method": method, "adaptive": False, **speculative}}))


# tiny-gemma3: six groups of layers, the sliding ones giving back pages while proposals come and go.
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def test_greedy_output_is_the_same_with_and_without_speculation(tiny_models, name):
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    spec = engine(tiny_models[name])
    outs = run(spec, PROMPTS, greedy)
    assert tokens(outs) == tokens(run(engine(tiny_models[name], "none"), PROMPTS, greedy))
    st = spec.stats()
    assert st["spec_draft_tokens"] > 0 and st["spec_accepted_tokens"] > 0   # it did speculate, and it paid:
    assert any(len(o) < 40 for o in outs.values())      # a request had several tokens in one step


def test_quantized_gguf_greedy_output_is_the_same(tmp_path):
    """Blocks multiplied in place with integer dots: the verified rows are decode rows, bit for bit."""
    import gguf

    from helpers.gguf_util import write_random_gguf
    model = write_random_gguf(tmp_path / "q8.gguf", gguf.GGMLQuantizationType.Q8_0)
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    prompts = [[t % 60 for t in p] for p in PROMPTS]   # the model's vocabulary is 64
    spec = engine(model)
    assert tokens(run(spec, prompts, greedy)) == tokens(run(engine(model, "none"), prompts, greedy))
    assert spec.stats()["spec_draft_tokens"] > 0


def test_seeded_sampling_with_every_parameter_draws_the_same_tokens(tiny):
    """A seeded request's generator is rewound to one draw per kept token, so speculation changes no
    token, logprob or stop, whatever the sampling parameters."""
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=40, ignore_eos=True, logprobs=3),
        SamplingParams(temperature=1.0, top_k=5, min_p=0.05, seed=2, max_tokens=40, ignore_eos=True,
                       repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2),
        SamplingParams(temperature=0.7, seed=3, max_tokens=40, min_tokens=30, logit_bias={31: 3.0, 32: -2.0}),
        SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[57], logprobs=2),
    ]
    a = run(engine(tiny), PROMPTS, params)
    b = run(engine(tiny, "none"), PROMPTS, params)
    assert tokens(a) == tokens(b)
    for rid in a:
        # Ids exactly; values as closely as float32 sums taken over a different number of rows allow.
        la, lb = ([(lp.token_id, lp.logprob, [(t.token_id, t.logprob) for t in lp.top])
                   for o in outs[rid] for lp in o.logprobs or ()] for outs in (a, b))
        assert [(i, [t for t, _ in top]) for i, _, top in la] == [(i, [t for t, _ in top]) for i, _, top in lb]
        assert [v for _, v, _ in la] == pytest.approx([v for _, v, _ in lb], abs=1e-5)
        assert a[rid][-1].finish_reason == b[rid][-1].finish_reason
        assert "".join(o.text for o in a[rid]) == "".join(o.text for o in b[rid])


def test_stop_strings_and_max_tokens_end_a_speculated_output_where_they_would(tiny):
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    text = "".join(o.text for o in run(engine(tiny, "none"), PROMPTS[:1], greedy)["r0"])
    stop = text[len(text) // 2:len(text) // 2 + 3]
    for params in (SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop]),
                   SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)):
        a, b = run(engine(tiny), PROMPTS, params), run(engine(tiny, "none"), PROMPTS, params)
        assert tokens(a) == tokens(b)
        assert [o[-1].text for o in a.values()] == [o[-1].text for o in b.values()]
        assert all(len(t) <= params.max_tokens for t in tokens(a).values())


def test_structured_output_masks_every_proposed_position(tiny):
    params = SamplingParams(temperature=0.9, seed=5, max_tokens=60,
                            structured={"regex": "(ab|cd){3,12}x"})
    a, b = run(engine(tiny), PROMPTS, params), run(engine(tiny, "none"), PROMPTS, params)
    assert tokens(a) == tokens(b)
    assert all(outs[-1].finish_reason == "stop" for outs in a.values())


def test_a_json_schema_with_its_digit_budget_masks_every_proposed_position(tiny):
    """The schema's matcher and the digit budget's both advance through the proposals
    (engine/structured/matcher_pair.py): every verified row gets the mask it would get one token at a time."""
    schema = ('{"type":"object","properties":{"a":{"type":"number"},"b":{"type":"array","items":'
              '{"type":"integer"},"maxItems":30}},"required":["a","b"],"additionalProperties":false}')
    params = [SamplingParams(temperature=t, seed=s, max_tokens=120, structured={"json_schema": schema})
              for t, s in ((0.0, 0), (0.9, 1), (1.2, 2), (0.7, 3))]
    a, b = run(engine(tiny), PROMPTS, params), run(engine(tiny, "none"), PROMPTS, params)
    assert tokens(a) == tokens(b)
    assert [o[-1].finish_reason for o in a.values()] == [o[-1].finish_reason for o in b.values()]


def test_a_small_pool_preempts_and_the_prefix_cache_shares_and_nothing_changes(tiny):
    """Proposals take pages only when every running sequence keeps one for its own token; preempted
    sequences resume with the same tokens, shared prefixes are found, rejected proposals' pages freed."""
    greedy = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    prompts = PROMPTS + [PROMPTS[0] + [1, 2], PROMPTS[0] + [3]]   # a shared 16-token prefix
    small = engine(tiny, num_blocks=14, max_model_len=128, disable_by_batch_size=8)
    assert tokens(run(small, prompts, greedy)) == tokens(run(engine(tiny, "none"), prompts, greedy))
    st = small.stats()
    assert st["preemptions"] > 0 and st["spec_accepted_tokens"] > 0 and st["prefix_cache_hit_tokens"] > 0


def test_unseeded_sampling_keeps_its_distribution(tiny):
    """Without a seed the draws differ run to run: the four-token continuations of 600 requests with
    speculation and 600 without are samples of one distribution (chi-square over up to 81 outcomes)."""
    # An alternating prompt, and a bias that makes its two tokens likely but not certain: the proposals
    # (the alternation continued) are accepted at some positions and rejected at others.
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=4, ignore_eos=True, logit_bias={90: 3.0, 91: 3.0})
    prompt = [90, 91] * 6 + [90]
    counts = []
    for method in ("ngram", "none"):
        llm = LLM.from_engine(engine(tiny, method, max_num_seqs=64, num_blocks=512, disable_by_batch_size=64,
                                     prompt_lookup_min=1))
        outs = llm.generate([{"prompt_token_ids": prompt}] * 600, params)
        counts.append(Counter(tuple(o.token_ids) for o in outs))
        if method == "ngram":
            st = llm.stats()
            assert st["spec_draft_tokens"] > 300 and 0 < st["spec_accepted_tokens"] < st["spec_draft_tokens"]
    keys = sorted(set(counts[0]) | set(counts[1]))
    a = np.array([counts[0][k] for k in keys], dtype=float)
    b = np.array([counts[1][k] for k in keys], dtype=float)
    keep = (a + b) >= 10   # cells too small for the test are pooled
    a = np.append(a[keep], a[~keep].sum())
    b = np.append(b[keep], b[~keep].sum())
    expected = (a + b) / 2
    nz = expected > 0
    chi2 = float((((a - expected) ** 2 + (b - expected) ** 2)[nz] / expected[nz]).sum())
    dof = int(nz.sum()) - 1
    # 99.9th percentile of chi-square with dof degrees of freedom (Wilson-Hilferty), to fail rarely by chance
    z = 3.09
    limit = dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3
    assert chi2 < limit, (chi2, limit, dof)


def test_it_turns_itself_off_above_the_batch_size_and_for_a_request_that_opts_out(tiny):
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    big = engine(tiny, disable_by_batch_size=3)
    run(big, PROMPTS, greedy)   # four running until the first ends: nothing proposed while they are four
    four_at_once = big.stats()["spec_drafts"]
    small = engine(tiny, disable_by_batch_size=4)
    run(small, PROMPTS, greedy)
    assert small.stats()["spec_drafts"] > four_at_once
    out = engine(tiny)
    run(out, PROMPTS, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, disable_speculation=True))
    assert out.stats()["spec_drafts"] == 0
    off = engine(tiny, "none")
    run(off, PROMPTS, greedy)
    assert off.stats()["spec_drafts"] == 0 and off.stats()["spec_num_tokens"] == 0


def test_per_position_counts_add_up(tiny):
    eng = engine(tiny, num_tokens=3)
    run(eng, PROMPTS, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    st = eng.stats()
    per = st["spec_accepted_per_position"]
    assert len(per) == 3 and sum(per) == st["spec_accepted_tokens"]
    assert per == sorted(per, reverse=True)   # a later position is accepted only after the earlier ones
    assert st["spec_acceptance_rate"] == pytest.approx(st["spec_accepted_tokens"] / st["spec_draft_tokens"])


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="prompt_lookup_min"):
        load_settings(overrides={"speculative": {"prompt_lookup_min": 5, "prompt_lookup_max": 3}})
    with pytest.raises(ConfigError, match="speculative.method"):
        load_settings(overrides={"speculative": {"method": "eagle"}})
    with pytest.raises(ConfigError, match="speculative.num_tokens"):
        load_settings(overrides={"speculative": {"num_tokens": 0}})


@pytest.mark.parametrize("tokens_, k, lo, hi, want", [
    ([1, 2, 3, 4, 5, 9, 1, 2, 3], 3, 2, 4, [4, 5, 9]),         # the longest recurring n-gram
    ([5, 1, 2, 7, 7, 1, 2, 8, 8, 8, 1, 2], 3, 2, 4, [8, 8, 8]),  # its latest occurrence
    ([5, 1, 2, 7, 7, 1, 2, 8, 8, 8, 1, 2], 3, 3, 4, []),         # nothing as long as asked
    ([1, 2, 3, 9, 9, 2, 3], 5, 2, 2, [9, 9, 2, 3]),              # no more than there is
    ([1, 2, 3], 4, 1, 4, []),
    ([4, 4, 4, 4], 3, 1, 2, [4]),
])
def test_ngram_proposals(tokens_, k, lo, hi, want):
    assert ngram.propose(np.array(tokens_, dtype=np.int64), k, lo, hi) == want


def test_step_costs_price_each_row_count_and_unseen_ones_to_be_tried():
    from nvllm.engine.speculation.step_costs import TRIES, WINDOW, StepCosts
    costs = StepCosts(8)
    assert costs.estimate(1) is None                   # nothing measured: no price
    costs.observe(1, 0.010)
    for _ in range(TRIES):
        costs.observe(4, 0.020)
    assert costs.estimate(1) == 0.010
    assert costs.estimate(2) == pytest.approx(0.011)   # unseen: a little above the nearest smaller count
    assert costs.estimate(6) == pytest.approx(0.024)
    costs.observe(4, 0.030)
    assert costs.estimate(4) == 0.020                  # the fastest of its recent steps
    for _ in range(WINDOW):
        costs.observe(4, 0.030)
    assert costs.estimate(4) == 0.030                  # ... which follow a lasting change
    costs.observe(9, 1.0)                              # past the counts it keeps: ignored
    assert costs.estimate(9) == costs.estimate(8)
    assert costs.seconds[1] == 0.010 and costs.seconds[4] == 0.030 and costs.seconds[2] is None


def test_one_slow_step_does_not_price_a_count_out_of_being_tried_again():
    """A count first measured in a step descheduled by other work is still priced as a guess until it
    has been tried TRIES times; then its own fastest step prices it."""
    from nvllm.engine.speculation.step_costs import TRIES, StepCosts
    costs = StepCosts(8)
    costs.observe(1, 0.010)
    costs.observe(5, 0.200)                            # 20x one row: a burst of something else
    assert costs.estimate(5) == pytest.approx(0.014)   # still the guess: tried again
    for _ in range(TRIES - 1):
        costs.observe(5, 0.017)
    assert costs.estimate(5) == 0.017
    assert costs.estimate(6) == pytest.approx(0.0187)  # unseen counts above it priced from its own price


def _seq_with(eng: LLMEngine, drafts: list[int], acceptance: float, idle: int = 0):
    seq = eng.make_sequence("s", [1, 2, 3], SamplingParams(max_tokens=50))
    seq.draft_tokens, seq.draft_acceptance, seq.draft_idle_steps = list(drafts), acceptance, idle
    return seq


def test_adaptive_speculation_verifies_what_pays_at_the_measured_costs(tiny):
    """With 4 rows costing 2x one and 5 rows 4x (a kernel's tile of four), a sequence whose proposals
    are always accepted verifies 3 of 4; one whose proposals are seldom accepted verifies none, but is
    probed after a while; a second sequence's rows are priced on top of the first's."""
    from nvllm.config import SpeculativeSettings
    from nvllm.engine.speculation.speculator import PROBE_EVERY, Speculator
    from nvllm.engine.speculation.step_costs import TRIES
    spec = Speculator(SpeculativeSettings(method="ngram", num_tokens=4), max_model_len=256)
    eng = engine(tiny)
    for rows, s in {1: 10, 2: 12, 3: 19, 4: 20, 5: 40, 6: 42, 7: 43, 8: 44, 9: 60, 10: 80}.items():
        for _ in range(TRIES):   # each count tried enough for its own price to stand
            spec.costs.observe(rows, s / 1000)
    good, bad = _seq_with(eng, [7, 8, 9, 10], 1.0), _seq_with(eng, [7, 8, 9, 10], 0.05)
    spec._choose([good])
    assert good.draft_tokens == [7, 8, 9]
    spec._choose([bad])
    assert bad.draft_tokens == [] and bad.draft_idle_steps == 1
    probed = _seq_with(eng, [7, 8], 0.05, idle=PROBE_EVERY)
    spec._choose([probed])
    assert probed.draft_tokens == [7] and probed.draft_idle_steps == 0
    # two sequences: 2 rows to start; the first takes 2 more (4 rows), the second none (5 would cost 2x)
    a, b = _seq_with(eng, [7, 8, 9, 10], 1.0), _seq_with(eng, [7, 8, 9, 10], 0.6)
    spec._choose([a, b])
    assert (len(a.draft_tokens), len(b.draft_tokens)) == (2, 0)


def test_no_probe_where_proposals_accepted_every_time_would_not_pay(tiny):
    """A draft model as costly as the target (its passes and its catching up priced in each step's
    rows): two rows cost 3x one, so even a proposal certain to be accepted loses, and a sequence idle
    for PROBE_EVERY steps is not probed: the probe could not change the choice, only cost a step."""
    from nvllm.config import SpeculativeSettings
    from nvllm.engine.speculation.speculator import PROBE_EVERY, Speculator
    from nvllm.engine.speculation.step_costs import TRIES
    spec = Speculator(SpeculativeSettings(method="ngram", num_tokens=4), max_model_len=256)
    eng = engine(tiny)
    for rows, s in {1: 10, 2: 30, 3: 45, 4: 60, 5: 75}.items():
        for _ in range(TRIES):
            spec.costs.observe(rows, s / 1000)
    idle = _seq_with(eng, [7, 8, 9, 10], 0.05, idle=PROBE_EVERY)
    spec._choose([idle])
    assert idle.draft_tokens == [] and idle.draft_idle_steps == PROBE_EVERY + 1
    sure = _seq_with(eng, [7, 8, 9, 10], 1.0)
    spec._choose([sure])
    assert sure.draft_tokens == []   # accepted every time, and still not worth its rows


def test_acceptance_estimate_follows_verified_positions(tiny):
    eng = engine(tiny, adaptive=True)
    run(eng, PROMPTS, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    st = eng.stats()
    assert st["spec_drafts"] > 0   # costs were measured and some proposals verified
    seq = _seq_with(eng, [5, 6, 7], 0.5)
    eng.speculator.accept(seq, np.array([5, 6, 9, 1]))   # two accepted, the third rejected
    assert seq.draft_acceptance == pytest.approx(0.544)   # 0.5 -> 0.6 -> 0.68 (accepted) -> 0.544 (rejected)
