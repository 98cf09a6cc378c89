"""Request priority through the engine (engine/scheduler.py): admission by priority then arrival, a
higher-priority request taking a lower one's seat or pages at once, equals never preempting each other,
aging that bounds how long a low-priority request waits while others keep arriving but never lifts
background work above an urgent request, and outputs that a preemption leaves as they would have been."""
from __future__ import annotations

from pathlib import Path

import pytest

from nvllm import SamplingParams
from nvllm.config import load_settings
from nvllm.engine.assembly.factory import build_engine
from nvllm.engine.assembly.pool_backing import PoolBacking
from nvllm.engine.llm_engine import LLMEngine
from nvllm.sampling_params import InvalidParameter


def engine(model: Path, num_blocks: int = 256, aging: int = 0, max_model_len: int = 256,
           **scheduler) -> LLMEngine:
    return build_engine(load_settings(overrides={
        "model": {"path": str(model)}, "cache": {"num_blocks": num_blocks, "block_size": 16},
        "scheduler": {"priority_aging_steps": aging, "max_model_len": max_model_len, **scheduler}}))


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def prompt(i: int) -> list[int]:
    return [(7 * i + k) % 200 + 3 for k in range(12 + i % 5)]


def first_token_steps(eng: LLMEngine, limit: int = 10_000) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Step until done: the step at which each request had its first token, and its tokens."""
    first: dict[str, int] = {}
    tokens: dict[str, list[int]] = {}
    for step in range(1, limit):
        if not eng.has_unfinished():
            break
        for out in eng.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
            if out.token_ids and out.request_id not in first:
                first[out.request_id] = step
    return first, tokens


def test_admission_is_by_priority_then_arrival(tiny):
    eng = engine(tiny, max_num_seqs=1)
    for rid, rank in (("a", 0), ("b", 5), ("c", -1), ("d", 0), ("e", -1)):
        eng.add_request(rid, prompt(len(rid)), greedy(3), rank)
    first, _ = first_token_steps(eng)
    assert sorted(first, key=lambda rid: first[rid]) == ["c", "e", "a", "d", "b"]


def test_a_higher_priority_request_takes_a_seat_at_once_and_the_victim_ends_as_it_would_have(tiny):
    alone = engine(tiny, max_num_seqs=2)
    for i in range(2):
        alone.add_request(f"low{i}", prompt(i), greedy(40))
    _, want = first_token_steps(alone)

    eng = engine(tiny, max_num_seqs=2)
    for i in range(2):
        eng.add_request(f"low{i}", prompt(i), greedy(40))
    for _ in range(5):
        eng.step()
    eng.add_request("urgent", prompt(9), greedy(4), -1)
    first, got = first_token_steps(eng)
    assert first["urgent"] == 1                        # counted from its arrival
    assert eng.scheduler.num_preemptions == 1
    assert len(got["urgent"]) == 4
    # preempted by recompute: the same greedy tokens as without the interruption
    for i in range(2):
        n = len(got[f"low{i}"])
        assert want[f"low{i}"][-n:] == got[f"low{i}"]


def test_a_higher_priority_request_takes_pages_when_the_pool_is_full(tiny):
    # 8 blocks of 16 tokens; two sequences growing to 60 tokens hold all of them
    eng = engine(tiny, num_blocks=8, max_model_len=128, max_num_seqs=8)
    for i in range(2):
        eng.add_request(f"low{i}", prompt(i), greedy(48))
    for _ in range(45):
        if eng.block_manager.num_free_blocks == 0:
            break
        eng.step()
    assert eng.block_manager.num_free_blocks == 0
    eng.add_request("urgent", prompt(9), greedy(2), -1)
    first, got = first_token_steps(eng)
    assert first["urgent"] <= 2 and len(got["urgent"]) == 2
    assert all(len(got[f"low{i}"]) > 0 for i in range(2))
    assert eng.scheduler.num_preemptions >= 1


def test_equal_priorities_never_preempt_each_other_even_aged(tiny):
    eng = engine(tiny, max_num_seqs=2, aging=1)
    for i in range(2):
        eng.add_request(f"run{i}", prompt(i), greedy(30))
    eng.step()
    for i in range(3):
        eng.add_request(f"wait{i}", prompt(i + 2), greedy(2))
    first, _ = first_token_steps(eng)
    assert eng.scheduler.num_preemptions == 0
    assert min(first[f"wait{i}"] for i in range(3)) > 28   # after a runner finished


@pytest.mark.parametrize("aging", [0, 4])
def test_aging_bounds_how_long_a_low_priority_request_waits(tiny, aging):
    """One seat, each request holding it 2 steps; a priority-0 request arrives every 2 steps, so one is
    always there to take it; a priority-3 one is waiting. With aging every 4 steps it ranks level with
    them after 3 x 4 steps (0: aging goes no further) and, having arrived first, takes the next free
    seat; with strict priority it never runs."""
    eng = engine(tiny, max_num_seqs=1, aging=aging)
    eng.add_request("low", prompt(99), greedy(2), 3)
    first: dict[str, int] = {}
    for step in range(1, 61):
        if step % 2:
            eng.add_request(f"high{step}", prompt(step), greedy(2), 0)
        for out in eng.step():
            if out.token_ids and out.request_id not in first:
                first[out.request_id] = step
    if aging:
        assert first.get("low", 999) <= (3 + 1) * aging + 1
    else:
        assert "low" not in first


def test_thirty_two_low_priority_streams_and_a_priority_request_first_token_within_two_steps(tiny):
    eng = engine(tiny, max_num_seqs=32, max_num_batched_tokens=512, num_blocks=512)
    # The whole pool backed first (it is backed in the background): the 32 streams must all hold seats.
    assert eng.backing is None or (isinstance(eng.backing, PoolBacking) and eng.backing.wait(60))
    for i in range(32):
        eng.add_request(f"low{i}", prompt(i), greedy(200), 1)
    for _ in range(10):
        eng.step()
    assert len(eng.scheduler.running) == 32
    eng.add_request("urgent", prompt(50), greedy(8), -1)
    for _ in (1, 2):
        if any(o.request_id == "urgent" and o.token_ids for o in eng.step()):
            break
    else:
        pytest.fail("the priority request had no token within 2 steps")


def test_an_urgent_request_is_seated_at_once_beside_background_work_aged_at_the_default_settings(tiny):
    """Issue 50: at the default seats and aging, 32 background streams (priority 0) of which 28 wait; once
    they have waited well past 2 x priority_aging_steps, an urgent request (priority -1) still has its
    first token within 2 steps: aging never lifts the background class above it, neither the waiting
    ones nor the rank the running ones were admitted at."""
    aging = load_settings().scheduler.priority_aging_steps
    assert aging > 0
    eng = build_engine(load_settings(overrides={"model": {"path": str(tiny)}}))
    seats = eng.scheduler.max_num_seqs
    assert seats < 32
    for i in range(32):
        eng.add_request(f"bg{i}", prompt(i), greedy(160))
    for _ in range(2 * aging + 64):
        eng.step()
    sched = eng.scheduler
    assert len(sched.running) == seats and len(sched.waiting) >= 8
    assert sched.steps - min(s.waiting_since for s in sched.waiting) > 2 * aging
    eng.add_request("urgent", prompt(50), greedy(8), -1)
    for _ in (1, 2):
        if any(o.request_id == "urgent" and o.token_ids for o in eng.step()):
            break
    else:
        pytest.fail("the urgent request had no token within 2 steps")


@pytest.mark.parametrize("bad", [True, "1", 1.5, 2**31, -(2**31) - 1])
def test_a_bad_priority_is_refused_naming_the_field(tiny, bad):
    eng = engine(tiny)
    with pytest.raises(InvalidParameter) as e:
        eng.add_request("x", prompt(1), greedy(2), bad)
    assert e.value.field == "priority"
    assert not eng.has_unfinished()
