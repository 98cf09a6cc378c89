"""Speculative decoding: which sequences get proposed tokens this step (from their own tokens,
engine/speculation/ngram.py, or by a draft model, engine/speculation/draft_proposer.py), how many the target model's
verification accepts, and the counts the metrics report.

A proposal is checked by the target model itself: the step computes the sequence's last token and each
proposed one as decode rows sharing its block table, so every row's logits are those a plain decode step
would give at that position. Each row is sampled as it would be without speculation (its own penalties,
bias, mask and the sequence's generator), and proposals are accepted while they equal what was sampled;
the first row that differs gives the next token instead, and when all match the last row gives one
more. A proposal is one token with probability 1, so "sample, then compare" is exactly rejection
sampling's rule (accept with probability p(token), else draw from p without it): the output is that of
decoding without speculation. A seeded request even draws the same numbers: its generator is rewound to
one draw per token kept, so its output is the same with and without speculation.

Where it pays: one decode step reads every weight for one row, and a few more rows cost less than
their share, but not by the same amount for every count (engine/speculation/step_costs.py). With `adaptive`, each
step verifies, of each sequence's proposal, the prefix that maximises the tokens expected per second:
the expected tokens from the sequence's own acceptance so far (each proposed position accepted with
probability a, the k-th therefore with a^k), the seconds from the measured cost of the step's rows.
Often that is none: free text with few matches costs nothing then (with a draft model the cut is
made before drafting, on how many tokens each sequence may get, so the draft runs only for those).
A sequence that gets none is still probed now and then, so that its acceptance estimate can recover, but
only where proposals always accepted would pay at the measured prices: a draft model's probe costs its
catching up on every token it skipped, and a probe that cannot change the choice is only a cost.
Above `disable_by_batch_size` running sequences nothing is proposed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from nvllm.config import SpeculativeSettings
from nvllm.engine.sequence import Sequence
from nvllm.engine.speculation import ngram
from nvllm.engine.speculation.draft_proposer import DraftProposer
from nvllm.engine.speculation.step_costs import StepCosts
from nvllm.model.sampling.sampler import GREEDY_EPS

ACCEPTANCE_ALPHA = 0.2   # weight of each verified position in it
PROBE_EVERY = 8          # steps a sequence goes without proposals before one is verified anyway


class Speculator:
    def __init__(self, settings: SpeculativeSettings, max_model_len: int) -> None:
        self.settings = settings
        self.max_model_len = max_model_len
        self.enabled = settings.method != "none"
        # vLLM's counters: steps with proposals (per sequence), tokens proposed, tokens accepted, and
        # accepted by position in the proposal.
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos: Counter[int] = Counter()
        self._states: dict[str, Any] = {}   # request id -> its generator's state before the step
        self.costs = StepCosts(settings.disable_by_batch_size * (settings.num_tokens + 1))
        self.drafter: DraftProposer | None = None   # method "draft": set by the factory

    def propose(self, running: list[Sequence]) -> None:
        """Set each running sequence's draft_tokens for the coming step (empty when it gets none)."""
        on = self.enabled and len(running) <= self.settings.disable_by_batch_size
        if self.drafter is not None:
            self.drafter.caught_up_long = False
        if self.settings.method != "draft" or not on:
            for seq in running:
                seq.draft_tokens = self._proposal(seq) if on else []
            if on and self.settings.adaptive:
                self._choose(running)
            return
        # A draft model costs a pass per token proposed: the adaptive cut comes first, on how many each
        # sequence may get, so the draft runs only for what will be verified.
        for seq in running:
            seq.draft_tokens = [-1] * self._room(seq)
        if self.settings.adaptive:
            self._choose(running)
        wants = [(seq, len(seq.draft_tokens)) for seq in running if seq.draft_tokens]
        if self.drafter is None or not wants:
            for seq in running:
                seq.draft_tokens = []
            return
        for (seq, _), drafts in zip(wants, self.drafter.propose(wants)):
            seq.draft_tokens = self._cut(seq, drafts)

    def observe(self, rows: int, seconds: float) -> None:
        """A decode-only step's time by its rows (the draft's passes included: they are part of what
        proposing costs), unless the draft caught up on a prompt in it."""
        if self.drafter is None or not self.drafter.caught_up_long:
            self.costs.observe(rows, seconds)

    def release(self, seq: Sequence) -> None:
        """seq finished, was aborted or preempted: the draft's pages for it go back."""
        if self.drafter is not None:
            self.drafter.release(seq)

    def _choose(self, running: list[Sequence]) -> None:
        """Cut each proposal to the length that makes the step's expected tokens per second highest,
        sequence by sequence, given the rows chosen for those before it."""
        rows = len(running)
        tokens = float(rows)       # expected this step
        for seq in running:
            drafts = seq.draft_tokens
            if not drafts:
                continue
            base = self.costs.estimate(rows)
            if base is None:       # no decode step measured yet: this one measures it
                seq.draft_tokens = []
                continue
            best_k = self._best(rows, tokens, base, len(drafts), seq.draft_acceptance)
            # A probe is for an acceptance estimate that may have fallen too low: only where proposals
            # accepted every time would pay at these prices (a draft model's catching up on the tokens
            # it skipped can make even a probe of one token cost several steps).
            if best_k == 0 and seq.draft_idle_steps >= PROBE_EVERY and self._best(rows, tokens, base, 1, 1.0):
                best_k = 1
            seq.draft_idle_steps = 0 if best_k else seq.draft_idle_steps + 1
            seq.draft_tokens = drafts[:best_k]
            rows += best_k
            tokens += sum(seq.draft_acceptance ** i for i in range(1, best_k + 1))

    def _best(self, rows: int, tokens: float, base: float, most: int, a: float) -> int:
        """The proposal length (0 .. most) with the most tokens expected per second, on top of a step of
        `rows` rows expecting `tokens` (costing `base`), each proposed position accepted with probability a."""
        best_k, best_rate, expected = 0, tokens / base, 0.0
        for k in range(1, most + 1):
            expected += a ** k
            cost = self.costs.estimate(rows + k)
            assert cost is not None
            if (tokens + expected) / cost > best_rate:
                best_k, best_rate = k, (tokens + expected) / cost
        return best_k

    def _room(self, seq: Sequence) -> int:
        """How many tokens seq may be proposed this step (0: none)."""
        p = seq.params
        if p.disable_speculation or seq.num_uncomputed_tokens != 1:   # prefilling: no decode row yet
            return 0
        assert p.max_tokens is not None   # make_sequence set it
        # A step emits up to k + 1 tokens: never past max_tokens or the context.
        k = min(self.settings.num_tokens, p.max_tokens - seq.num_output_tokens - 1,
                self.max_model_len - seq.num_tokens - 1)
        if seq.structured is not None and seq.num_output_tokens < p.min_tokens:
            return 0   # (min_tokens under a grammar depends on the grammar's state at each row)
        return max(0, k)

    def _proposal(self, seq: Sequence) -> list[int]:
        k = self._room(seq)
        if not k:
            return []
        s = self.settings
        return self._cut(seq, ngram.propose(seq.token_array(), k, s.prompt_lookup_min, s.prompt_lookup_max))

    @staticmethod
    def _cut(seq: Sequence, drafts: list[int]) -> list[int]:
        matcher = seq.structured
        if drafts and matcher is not None:   # only what the grammar allows can be accepted
            drafts = drafts[:matcher.validate_tokens(drafts)]
        waiting = seq.structured_after_thinking
        if waiting is not None and waiting[0] in drafts:
            # The row after the end of thinking must be masked, which this step's rows are not: stop before it.
            drafts = drafts[:drafts.index(waiting[0])]
        return drafts

    def before_sampling(self, seqs: list[Sequence]) -> None:
        """Remember the generators of the sequences about to sample several rows."""
        self._states = {s.request_id: s.generator.bit_generator.state for s in seqs
                        if s.draft_tokens and (s.params.temperature or 0) >= GREEDY_EPS}

    def accept(self, seq: Sequence, sampled: np.ndarray) -> int:
        """How many of seq's proposals its rows' tokens confirm (sampled: the k + 1 rows' tokens); the
        generator is left as if it had drawn only for the tokens kept."""
        drafts = seq.draft_tokens
        accepted = 0
        while accepted < len(drafts) and int(sampled[accepted]) == drafts[accepted]:
            accepted += 1
        self.num_drafts += 1
        self.num_draft_tokens += len(drafts)
        self.num_accepted_tokens += accepted
        for pos in range(accepted):
            self.accepted_per_pos[pos] += 1
        # Positions verified: each accepted one, and the first rejected (later ones were not tried).
        for outcome in [1.0] * accepted + [0.0] * (accepted < len(drafts)):
            seq.draft_acceptance += ACCEPTANCE_ALPHA * (outcome - seq.draft_acceptance)
        state = self._states.pop(seq.request_id, None)
        if state is not None:   # one uniform per kept token, as decoding them one by one draws
            seq.generator.bit_generator.state = state
            seq.generator.random(accepted + 1)
        return accepted

    def stats(self) -> dict[str, Any]:
        rate = self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0
        return {
            "spec_method": self.settings.method,
            "spec_num_tokens": self.settings.num_tokens if self.enabled else 0,
            "spec_drafts": self.num_drafts,
            "spec_draft_tokens": self.num_draft_tokens,
            "spec_accepted_tokens": self.num_accepted_tokens,
            "spec_accepted_per_position": [self.accepted_per_pos[i] for i in range(self.settings.num_tokens)],
            "spec_acceptance_rate": rate,
        }
