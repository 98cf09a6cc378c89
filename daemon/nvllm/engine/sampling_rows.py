"""The sampler's batch for a step's rows: one per sequence due a token, or one per verified position
of a sequence with proposed tokens, each row seeing the sequence as it would be at that position."""

from __future__ import annotations

import numpy as np

from nvllm.engine.sequence import Sequence
from nvllm.model.sampling.batch import SamplingBatch
from nvllm.model.sampling.sampler import GREEDY_EPS

_EMPTY = np.zeros(0, dtype=np.int64)

# A row: the sequence, and the proposed tokens that come before this row's position (none for a plain
# decode row), which count as output for its penalties and min_tokens.
Row = tuple[Sequence, list[int]]


def plain_greedy(rows: list[Row]) -> bool:
    """Whether every row takes its argmax with nothing applied first (sampler.greedy's rows): temperature 0, no
    penalties, bias, logprobs, constraint, or stop tokens banned by min_tokens."""
    for s, ahead in rows:
        p = s.params
        if (p.temperature is None or p.temperature >= GREEDY_EPS or p.logprobs is not None or p.logit_bias
                or s.structured is not None or p.penalised or s.num_output_tokens + len(ahead) < p.min_tokens):
            return False
    return True


def _seen(s: Sequence, ahead: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(prompt ids, output ids) a penalised row's penalties read."""
    output = np.asarray(s.output_token_ids + ahead, dtype=np.int64)
    n = s.params.penalty_last_n
    if n is None:
        return s.prompt_array, output
    if n <= len(output):
        return _EMPTY, output[len(output) - n:]
    return _EMPTY, np.concatenate((s.prompt_array[max(0, len(s.prompt_array) - (n - len(output))):], output))


def sampling_batch(rows: list[Row], constrained: list[int] | None = None,
                   bits: np.ndarray | None = None) -> SamplingBatch:
    ps = [s.params for s, _ in rows]
    f32 = lambda vals: np.asarray(vals, dtype=np.float32)  # noqa: E731
    banned = []
    for s, ahead in rows:
        # Under a constraint, the grammar's end wins over min_tokens: EOS stays allowed once it accepts.
        # (No sequence under both has proposals before min_tokens: engine/speculation/speculator.py.)
        if s.num_output_tokens + len(ahead) < s.params.min_tokens and \
                (s.structured is None or not s.structured.is_accepting()):
            stop_ids = set(s.params.stop_token_ids or ())
            if not s.params.ignore_eos:
                stop_ids |= s.eos_token_ids
            banned.append(np.fromiter(stop_ids, dtype=np.int64) if stop_ids else None)
        else:
            banned.append(None)
    penalised = [p.penalised for p in ps]
    # A row's penalties look at (prompt ids, output ids): vLLM's split, or with a window (penalty_last_n) its last
    # tokens of both together as the output alone, which every penalty then reads (model/sampling/penalties.py).
    seen = [_seen(s, ahead) if pen else (_EMPTY, _EMPTY) for (s, ahead), pen in zip(rows, penalised)]
    biased = [(i, p.logit_bias) for i, p in enumerate(ps) if p.logit_bias]
    bias_rows = np.concatenate([np.full(len(b), i, dtype=np.int64) for i, b in biased]) if biased else None
    return SamplingBatch(
        temperature=f32([p.temperature for p in ps]),
        top_k=np.asarray([p.top_k for p in ps], dtype=np.int32),
        top_p=f32([p.top_p for p in ps]),
        min_p=f32([p.min_p for p in ps]),
        presence_penalty=f32([p.presence_penalty if pen else 0.0 for p, pen in zip(ps, penalised)]),
        frequency_penalty=f32([p.frequency_penalty if pen else 0.0 for p, pen in zip(ps, penalised)]),
        repetition_penalty=f32([p.repetition_penalty if pen else 1.0 for p, pen in zip(ps, penalised)]),
        output_token_ids=[out for _, out in seen],
        prompt_token_ids=[prompt for prompt, _ in seen],
        generators=[s.generator for s, _ in rows],
        banned_token_ids=banned,
        num_logprobs=np.asarray([-1 if p.logprobs is None else p.logprobs for p in ps], dtype=np.int32),
        allowed_tokens=bits if constrained else None,
        allowed_rows=np.asarray(constrained, dtype=np.int64) if constrained else None,
        bias_rows=bias_rows,
        bias_ids=np.fromiter((t for _, b in biased for t in b), dtype=np.int64) if biased else None,
        bias_values=f32([v for _, b in biased for v in b.values()]) if biased else None,
    )
