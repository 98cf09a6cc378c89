"""Continuous batching: which tokens of which sequences run in the next forward pass.

Each step has a token budget. Running sequences go first (a decode token each, or the next chunk of a
prompt still being prefilled), then waiting sequences are admitted by priority (lower runs earlier,
vLLM's rule), then arrival, with as much of their prompt as the budget leaves (chunked prefill), so
decodes are never starved by a long prompt. Pages are registered in the prefix cache as they are
allocated, so a request admitted after another in the same step already reuses the blocks that one
computes in this step.
Running sequences are kept by the rank they were admitted at, then admission: when one needs a page
and none is free, the last (lowest priority, most recently admitted) is preempted by recompute: its
pages are freed and it goes back to the queue. A waiting request that outranks the last running one
takes its seat and pages the same way when the batch or the pool is full.
A request waiting does not starve: a priority class of priority >= 0 ranks one level higher for every
`aging_steps` steps its oldest member has waited (0: strict priority), down to rank 0 and no further, so
it ends up level with the background work that keeps arriving and, being older, first among it. Aging
never lifts it above an urgent class (priority < 0): those keep strict priority among themselves and
always rank above every other class, waiting or running (a running sequence keeps the rank it was
admitted at, which is never below 0 for a background one), so an urgent request is seated within a step
or two however many requests wait and however long they have waited (and urgent work that never stops
holds the rest back: urgent is meant to be rare).
While the board is hot the engine sets `throttled_budget`, a smaller step budget; it never preempts or
reorders anything, and any sequence of priority < 0 running or waiting brings the full budget back, so the
urgent request is not slowed by the throttle.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable
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
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 aging_steps: int = 0, on_release: Callable[[Sequence], None] | None = None) -> None:
        self.block_manager = block_manager
        self.on_release = on_release   # told of each sequence whose pages are freed (the draft's too)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.throttled_budget: int | None = None   # the step budget while the board is hot; None: the full one
        self.aging_steps = aging_steps
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []    # by (rank, admission): the last is preempted first
        self.num_preemptions = 0
        self.steps = 0
        self._arrivals = 0
        self._admissions = 0
        self._bonus: dict[int, int] = {}      # priority -> levels its waiting class has gained this step

    def add(self, seq: Sequence) -> None:
        seq.arrival = self._arrivals
        self._arrivals += 1
        seq.waiting_since = self.steps
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        if self.on_release is not None:
            self.on_release(seq)
        seq.draft_tokens = []
        seq.status = SequenceStatus.WAITING
        seq.waiting_since = self.steps
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _num_new_tokens(self, seq: Sequence, budget: int) -> int:
        """Tokens of a running sequence this step computes: its own uncomputed ones and as many of its
        proposed tokens as the budget and the free pages allow (a proposal never preempts anything)."""
        own = min(seq.num_uncomputed_tokens, budget)
        drafts, bm = seq.draft_tokens, self.block_manager
        if drafts:
            del drafts[max(0, budget - own):]
            total = seq.num_computed_tokens + own + len(drafts)
            # A page for every running sequence's own next token is left free, so that no proposal takes
            # the page another sequence needs.
            if bm.num_new_blocks(seq, total) + len(self.running) * bm.num_groups > bm.num_free_blocks or \
                    not bm.ensure_slots(seq, total):
                drafts.clear()
        return own + len(drafts)

    def _order_waiting(self) -> None:
        """Waiting sequences by rank, then arrival. With one priority among them the queue keeps its
        order (arrivals appended, preempted ones at the head)."""
        classes = {s.priority for s in self.waiting}
        self._bonus = {}
        if self.aging_steps:
            for p in classes:
                if p <= 0:
                    continue   # urgent classes keep strict priority; rank 0 is as high as aging goes
                waited = self.steps - min(s.waiting_since for s in self.waiting if s.priority == p)
                self._bonus[p] = min(p, waited // self.aging_steps)
        if len(classes) > 1:
            self.waiting = deque(sorted(self.waiting, key=lambda s: (self._rank(s), s.arrival)))

    def _rank(self, seq: Sequence) -> int:
        """A waiting sequence's priority less what its class has gained by waiting: never below 0 for a
        class of priority >= 0, so that aged background work never outranks an urgent class."""
        return seq.priority - self._bonus.get(seq.priority, 0)

    def _head_outranks(self, victim: Sequence) -> bool:
        """Whether the head of the queue may take running `victim`'s seat and pages: it ranks strictly
        above the rank `victim` was admitted at, and is of another priority (within one priority the
        queue waits its turn, so aging never swaps equals back and forth)."""
        head = self.waiting[0]
        return head.priority != victim.priority and self._rank(head) < victim.rank

    def _run(self, seq: Sequence) -> None:
        seq.rank = self._rank(seq)
        seq.admission = self._admissions
        self._admissions += 1
        seq.status = SequenceStatus.RUNNING
        bisect.insort(self.running, seq, key=lambda s: (s.rank, s.admission))

    def step_budget(self) -> int:
        """This step's token budget: the throttled one, unless a sequence of priority < 0 runs or waits."""
        full, low = self.max_num_batched_tokens, self.throttled_budget
        if low is None or low >= full or any(s.priority < 0 for s in (*self.running, *self.waiting)):
            return full
        return low

    def schedule(self) -> ScheduledBatch:
        self.steps += 1
        budget = self.step_budget()
        bm = self.block_manager
        scheduled: list[Sequence] = []
        counts: list[int] = []

        # 1. Running sequences, highest priority and oldest first.
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._num_new_tokens(seq, budget)
            while not bm.ensure_slots(seq, seq.num_computed_tokens + n):
                victim = self.running.pop()          # the lowest priority, newest
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

        # 2. Waiting sequences, by priority and arrival, while budget, seats and pages last. In a step
        # that had to preempt pages are short already: only a request that outranks a running one
        # is admitted then, in its place.
        self._order_waiting()
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            outranks = bool(self.running) and self._head_outranks(self.running[-1])
            if preempted and not outranks:
                break
            if len(self.running) >= self.max_num_seqs:
                if not outranks:
                    break
                budget += self._unseat(scheduled, counts)
                continue
            # Hits may include blocks that sequences scheduled earlier in this step compute now.
            hits = bm.lookup(seq)
            cached = len(hits[0]) * bm.block_size
            n = min(seq.num_tokens - cached, budget)
            if seq.pooling is not None and n < seq.num_tokens - cached:
                break   # a pooling request is computed whole, in one step: it waits for a step with room
            if not bm.admit(seq, hits, cached + n, record=not seq.admitted_once):
                if not outranks:
                    break  # not enough pages yet; nothing was taken
                budget += self._unseat(scheduled, counts)
                continue
            if not seq.admitted_once:
                seq.num_cached_tokens = cached
                seq.admitted_once = True
                seq.scheduled_at = time.monotonic()
            self.waiting.popleft()
            self._run(seq)
            scheduled.append(seq)
            counts.append(n)
            budget -= n
        return ScheduledBatch(scheduled, counts)

    def _unseat(self, scheduled: list[Sequence], counts: list[int]) -> int:
        """Preempt the last running sequence for the head of the queue; returns the budget it had this
        step."""
        victim = self.running.pop()
        given_back = 0
        if victim in scheduled:
            k = scheduled.index(victim)
            given_back = counts.pop(k)
            scheduled.pop(k)
        self._preempt(victim)
        self._order_waiting()
        return given_back

    def finish(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence from the queues and free its pages."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        if self.on_release is not None:
            self.on_release(seq)
        seq.status = SequenceStatus.FINISHED
