"""Draft-model speculation: a smaller model sharing the target's tokenizer proposes each sequence's next
k tokens, greedily, from a small page pool of its own.

Each step, for the sequences the speculator proposes for, the draft first catches up on the tokens it
has not computed (prefill chunks, every sequence in one forward pass), which gives its first proposal,
then runs k - 1 decode steps (one row per sequence, batched) for the others. It keeps, per sequence,
its block table and which tokens it holds: the sequence's first `base` tokens and the proposals fed
after them (`tail`). Verification keeps a prefix of those proposals, the same tokens, so the draft's
valid prefix next step is `base` plus the tail's agreement with what the sequence kept: no KV is
copied, and a proposal cut by the scheduler or the adaptive rule needs no bookkeeping at all.

A draft that fails never fails a request: the step proposes nothing and the draft's state is dropped
(rebuilt by catching up later).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from nvllm.engine.sequence import Sequence
from nvllm.model.decoder import ForwardBatch, Model
from nvllm.model.kv_cache import KVCache

log = logging.getLogger("nvllm.engine.draft")


@dataclass
class DraftState:
    blocks: list[int] = field(default_factory=list)   # its pages in the draft's pool
    base: int = 0                                      # the sequence's first `base` tokens are computed
    tail: list[int] = field(default_factory=list)      # proposals computed after them

    def valid(self, seq: Sequence) -> int:
        """Tokens of seq whose K/V the draft holds: base, then the proposals the sequence kept."""
        kept = seq.token_ids[self.base:self.base + len(self.tail)]
        n = 0
        while n < len(kept) and kept[n] == self.tail[n]:
            n += 1
        return self.base + n


@dataclass
class _Job:
    seq: Sequence
    k: int                  # tokens to propose
    state: DraftState
    done: int               # tokens the draft has computed
    drafts: list[int] = field(default_factory=list)


class DraftProposer:
    def __init__(self, model: Model, kv_cache: KVCache, max_len: int, chunk_tokens: int) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.max_len = max_len              # positions the draft may hold: max_model_len, its own limit
        self.chunk_tokens = max(1, chunk_tokens)   # catch-up tokens per forward pass, all sequences
        self.free: list[int] = list(range(kv_cache.num_blocks - 1, -1, -1))
        self.states: dict[Sequence, DraftState] = {}
        self.num_failures = 0
        # Whether the last proposal caught a sequence up on more than a step's tokens (a prompt): that
        # step's time is no price for its rows.
        self.caught_up_long = False

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def release(self, seq: Sequence) -> None:
        """Give back seq's pages (it finished, was aborted or preempted)."""
        st = self.states.pop(seq, None)
        if st is not None:
            self.free.extend(reversed(st.blocks))

    def reset(self) -> None:
        for seq in list(self.states):
            self.release(seq)

    def propose(self, wants: list[tuple[Sequence, int]]) -> list[list[int]]:
        """Up to k greedy tokens for each (sequence, k); [] for one the draft cannot serve."""
        try:
            return self._propose(wants)
        except Exception:
            self.num_failures += 1
            if self.num_failures == 1:
                log.exception("the draft model failed; this step proposes nothing (logged once)")
            self.reset()   # whatever it wrote is not trusted
            return [[] for _ in wants]

    def _propose(self, wants: list[tuple[Sequence, int]]) -> list[list[int]]:
        bs = self.kv_cache.block_size
        jobs: list[_Job] = []
        for seq, k in wants:
            n = seq.num_tokens
            k = min(k, self.max_len - n + 1)   # it computes positions up to n + k - 2
            if k <= 0:
                continue
            st = self.states.setdefault(seq, DraftState())
            need = -(-(n + k - 1) // bs) - len(st.blocks)
            if need > len(self.free):
                continue   # the pool holds disable_by_batch_size sequences: only when sized smaller
            st.blocks.extend(self.free.pop() for _ in range(max(0, need)))
            # At least the last token is run again: its logits give the first proposal.
            jobs.append(_Job(seq, k, st, min(st.valid(seq), n - 1)))
        self._catch_up(jobs)
        for step in range(1, max((j.k for j in jobs), default=0)):
            rows = [j for j in jobs if j.k > step]
            nxt = self._forward([(j, [j.drafts[-1]], True) for j in rows])
            for j, t in zip(rows, nxt):
                j.drafts.append(int(t))
        for j in jobs:
            j.state.base, j.state.tail = j.seq.num_tokens, j.drafts[:j.k - 1]
        by_seq = {id(j.seq): j.drafts for j in jobs}
        return [by_seq.get(id(seq), []) for seq, _ in wants]

    def _catch_up(self, jobs: list[_Job]) -> None:
        """Run each job's uncomputed tokens through the draft, chunk by chunk; the pass that reaches
        a sequence's end gives its first proposal."""
        pending = [j for j in jobs if j.done < j.seq.num_tokens]
        self.caught_up_long = any(j.seq.num_tokens - j.done > j.k + 1 for j in pending)
        while pending:
            share = max(1, self.chunk_tokens // len(pending))
            items = []
            for j in pending:
                m = min(share, j.seq.num_tokens - j.done)
                items.append((j, j.seq.token_ids[j.done:j.done + m], j.done + m == j.seq.num_tokens))
            tokens = iter(self._forward(items))
            for j, _, last in items:
                if last:
                    j.drafts.append(int(next(tokens)))
            pending = [j for j in pending if j.done < j.seq.num_tokens]

    def _forward(self, items: list[tuple[_Job, list[int], bool]]) -> np.ndarray:
        """One draft forward pass over each job's next ids (from its `done` position); the argmax of
        the last row of each job flagged True, in order. Advances each job's `done`."""
        bs = self.kv_cache.block_size
        ids, pos, slots, qlens, clens, logit_rows, tables = [], [], [], [], [], [], []
        t = 0
        for j, chunk, want in items:
            p = np.arange(j.done, j.done + len(chunk))
            table = np.asarray(j.state.blocks, dtype=np.int64)
            ids.extend(chunk)
            pos.append(p)
            slots.append(table[p // bs] * bs + p % bs)
            qlens.append(len(chunk))
            clens.append(j.done + len(chunk))
            tables.append(table)
            t += len(chunk)
            if want:
                logit_rows.append(t - 1)
            j.done += len(chunk)
        block_tables = np.zeros((len(tables), max(len(tb) for tb in tables)), dtype=np.int32)
        for r, tb in enumerate(tables):
            block_tables[r, :len(tb)] = tb
        fb = ForwardBatch.build(np.asarray(ids, dtype=np.int64), np.concatenate(pos), np.concatenate(slots),
                                np.asarray(qlens), np.asarray(clens), block_tables,
                                np.asarray(logit_rows, dtype=np.int64))
        logits = self.model.forward(fb, self.kv_cache)
        return np.argmax(logits, axis=1) if logit_rows else np.zeros(0, dtype=np.int64)
