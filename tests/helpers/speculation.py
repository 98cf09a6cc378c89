"""What the speculative-decoding tests share: prompts that repeat themselves (so proposals are made from
the first step on) and ones that do not, and a run of requests to the end with the books checked."""
from __future__ import annotations

from nvllm import SamplingParams
from nvllm.engine.llm_engine import LLMEngine

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12] * 3 + [5, 6, 7], [30 + i % 7 for i in range(40)], list(range(40, 80)),
           [90, 91, 92, 93, 90, 91, 92]]


def run(eng: LLMEngine, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
        check: bool = True) -> dict[str, list]:
    """Every request to the end, the books checked after each step: request id -> its outputs."""
    per = params if isinstance(params, list) else [params] * len(prompts)
    for i, (p, sp) in enumerate(zip(prompts, per)):
        eng.add_request(f"r{i}", {"prompt_token_ids": p}, sp)
    outs: dict[str, list] = {f"r{i}": [] for i in range(len(prompts))}
    while eng.has_unfinished():
        for out in eng.step():
            outs[out.request_id].append(out)
        if check:
            eng.block_manager.check_integrity(list(eng.seqs.values()))
    bm = eng.block_manager
    assert bm.num_used_blocks == 0   # nothing leaked
    return outs


def tokens(outs: dict[str, list]) -> dict[str, list[int]]:
    return {rid: [t for o in seq for t in o.token_ids] for rid, seq in outs.items()}
