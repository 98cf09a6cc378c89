"""One request's state: its tokens, its pages, how far the cache has computed it, and why it ended."""

from __future__ import annotations

import enum
import time
from typing import Any

import numpy as np

from nvllm.engine.outputs import TokenLogprob
from nvllm.pooling_params import PoolingParams
from nvllm.sampling_params import InvalidParameter, SamplingParams
from nvllm.text.detokenizer import IncrementalDetokenizer

# A request's priority: lower runs earlier; the range of the gRPC field (int32).
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1
PRIOR_ACCEPTANCE = 0.5   # a sequence's speculative acceptance estimate before its first verified proposal


def check_priority(priority: Any) -> int:
    """A request's priority as an int, or InvalidParameter naming the field."""
    if isinstance(priority, bool) or not isinstance(priority, (int, np.integer)) \
            or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise InvalidParameter("priority", priority, f"an integer in [{PRIORITY_MIN}, {PRIORITY_MAX}]")
    return int(priority)


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 detokenizer: IncrementalDetokenizer, eos_token_ids: frozenset[int], seed: int,
                 priority: int = 0) -> None:
        self.request_id = request_id
        self.priority = priority          # lower runs earlier (vLLM's rule)
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.detokenizer = detokenizer
        self.eos_token_ids = eos_token_ids
        self.generator = np.random.default_rng(seed)
        self.status = SequenceStatus.WAITING
        self.block_tables: list[list[int]] = []   # per group of the pool's layout (model/kv_layout.py)
        self.block_hashes: list[bytes] = []   # prefix-cache hash of each full block, computed once
        self.num_computed_tokens = 0      # tokens whose K/V are in the pool
        self.num_cached_tokens = 0        # prompt tokens served by the prefix cache at first admission
        self.dropped_prompt_tokens = 0    # a chat's oldest turns dropped to fit the context (drop_oldest)
        self.admitted_once = False
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.text_end: int | None = None  # where a stop string cut the output text
        self.num_text_sent = 0            # characters of self.text already handed out
        self.num_tokens_sent = 0
        self.pending_logprobs: list[TokenLogprob] = []
        self.prompt_array = np.asarray(prompt_token_ids, dtype=np.int64)
        self._array = np.zeros(max(64, 2 * len(prompt_token_ids)), dtype=np.int64)   # token_ids, as filled
        self._array_len = 0
        # Tokens proposed for this step (engine/speculation/), verified with its last token; not yet its own.
        self.draft_tokens: list[int] = []
        self.draft_acceptance = PRIOR_ACCEPTANCE   # its proposals' share accepted, per position, lately
        self.draft_idle_steps = 0                  # steps since its last verified proposal
        # Structured output: the request's llguidance matcher (engine/structured/compiler.py), which has consumed
        # exactly the output tokens so far (preemption by recompute keeps them, so it keeps its state).
        self.structured: Any = None
        # (end-of-thinking token id, matcher): a grammar that starts once the model ends its thinking
        # (engine/structured/thinking.py); meanwhile structured is None and nothing is masked.
        self.structured_after_thinking: tuple[int, Any] | None = None
        self.error: str | None = None     # why the engine failed the request, when it did
        # A pooling request (an embedding model's or a reranker's): computed whole in one step, then pooled
        # into `pooled` and finished; token_types are an encoder's segment ids (None: all 0).
        self.pooling: PoolingParams | None = None
        self.token_types: list[int] | None = None
        self.pooled: list[float] | None = None
        # A transcription's state over its windows (engine/transcription/transcript.py); None otherwise.
        self.transcript: Any = None
        # The scheduler's bookkeeping: arrival order, the step it last began waiting, and while it
        # runs the rank it was admitted at and its admission order.
        self.arrival = 0
        self.waiting_since = 0
        self.rank = priority
        self.admission = 0
        # When (time.monotonic) the engine took it and first scheduled it: with the moment its first token is
        # handed out, its time to first token split into queueing and prefill (RequestOutput.queued_s, prefill_s).
        self.added_at = time.monotonic()
        self.scheduled_at: float | None = None

    def restart(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Begin again from a new prompt (a transcription's next window): the caller has freed its pages."""
        assert not self.block_tables, "restarted with pages held"
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.prompt_array = np.asarray(prompt_token_ids, dtype=np.int64)
        self._array_len = 0
        self.block_hashes = []
        self.num_computed_tokens = 0
        self.num_tokens_sent = 0
        self.params = params
        self.status = SequenceStatus.WAITING

    @property
    def text(self) -> str:
        """The output text so far, cut where a stop string matched."""
        return self.detokenizer.text if self.text_end is None else self.detokenizer.text[:self.text_end]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def token_array(self) -> np.ndarray:
        """token_ids as an int64 array, kept up to date as tokens are appended (they never go away)."""
        n = len(self.token_ids)
        if n > self._array.size:
            grown = np.zeros(max(2 * self._array.size, n), dtype=np.int64)
            grown[:self._array_len] = self._array[:self._array_len]
            self._array = grown
        if n > self._array_len:
            self._array[self._array_len:n] = self.token_ids[self._array_len:n]
            self._array_len = n
        return self._array[:n]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens
