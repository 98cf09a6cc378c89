"""Continuous batching: which tokens of which sequences run in the next forward pass.

Each step has a token budget. Running sequences go first (a decode token each, or the next chunk of a
prompt still being prefilled), then waiting sequences are admitted in arrival order with as much of
their prompt as the budget leaves (chunked prefill), so decodes are never starved by a long prompt.
Pages are registered in the prefix cache as they are allocated, so a request admitted after another in
the same step already reuses the blocks that one computes in this step.
When a running sequence needs a page and none is free, the most recently admitted sequence is
preempted by recompute: its pages are freed and it goes back to the head of the queue.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from nvllm.engine.block_manager import BlockManager
from nvllm.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence]
    num_new_tokens: list[int]       # tokens of each sequence computed this step

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.seqs)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []    # in admission order: the last is preempted first
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def schedule(self) -> ScheduledBatch:
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        scheduled: list[Sequence] = []
        counts: list[int] = []

        # 1. Running sequences, oldest first.
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            while not bm.ensure_slots(seq, seq.num_computed_tokens + n):
                victim = self.running.pop()          # the newest
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                scheduled.append(seq)
                counts.append(n)
                budget -= n
                i += 1
                continue
            break  # seq itself was preempted; everything after it already was too

        # 2. Waiting sequences, in arrival order, while budget, seats and pages last.
        # Nothing new is admitted in a step that had to preempt: pages are short already.
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            seq = self.waiting[0]
            # Hits may include blocks that sequences scheduled earlier in this step compute now.
            hits = bm.lookup(seq)
            cached = len(hits) * bm.block_size
            n = min(seq.num_tokens - cached, budget)
            if not bm.admit(seq, hits, cached + n, record=not seq.admitted_once):
                break  # not enough pages yet; nothing was taken
            if not seq.admitted_once:
                seq.num_cached_tokens = cached
                seq.admitted_once = True
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(seq)
            counts.append(n)
            budget -= n
        return ScheduledBatch(scheduled, counts)

    def finish(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence from the queues and free its pages."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
