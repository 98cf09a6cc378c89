"""The page books: every page free, cached or owned exactly once, whatever happens to them."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nvllm.engine.block_manager import BlockManager, IntegrityError


@dataclass
class Seq:
    token_ids: list[int]
    block_tables: list[list[int]] = field(default_factory=list)

    @property
    def block_table(self) -> list[int]:
        """Group 0's table (the only one of a pool of one group)."""
        return self.block_tables[0] if self.block_tables else []
    num_computed_tokens: int = 0
    block_hashes: list[bytes] = field(default_factory=list)


Content = list[list[int | None]]   # what each slot of the pool holds: the token whose K/V was written there


def admit(bm: BlockManager, seq: Seq, upto: int | None = None, record: bool = True) -> int | None:
    """What the scheduler does for a waiting sequence: look up its cached prefix, then take it and pages
    for its first `upto` tokens (all by default). Returns the tokens reused, None if pages ran short."""
    hits = bm.lookup(seq)
    upto = len(seq.token_ids) if upto is None else upto
    if not bm.admit(seq, hits, max(upto, len(hits[0]) * bm.block_size + 1), record):
        return None
    return seq.num_computed_tokens


def compute(bm: BlockManager, seq: Seq, upto: int, content: Content | None = None) -> None:
    """The forward pass for tokens [num_computed, upto): their K/V (here, the token ids) go to their slots,
    in every group; then, as the engine does, the sliding groups give back what their windows left."""
    before, bs = seq.num_computed_tokens, bm.block_size
    if content is not None:
        for table in seq.block_tables:
            for p in range(before, upto):
                content[table[p // bs]][p % bs] = seq.token_ids[p]
    seq.num_computed_tokens = upto
    bm.mark_computed(seq, before)
    bm.release_behind_window(seq)


def run(bm: BlockManager, seq: Seq, upto: int | None = None, content: Content | None = None) -> bool:
    """Pretend the model computed the sequence up to `upto` tokens, as the engine does."""
    upto = len(seq.token_ids) if upto is None else upto
    if not bm.ensure_slots(seq, upto):
        return False
    compute(bm, seq, upto, content)
    return True


def test_allocate_then_free_returns_every_page():
    bm = BlockManager(8, 4)
    s = Seq(list(range(10)))
    admit(bm, s)
    assert run(bm, s)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 8 - 3
    bm.free(s)
    bm.check_integrity([])
    assert bm.num_free_blocks == 8 and bm.num_cached_blocks == 2  # two full blocks stay cached


def test_prefix_hit_shares_pages_and_leaves_last_token_to_compute():
    bm = BlockManager(16, 4)
    a = Seq(list(range(12)))
    admit(bm, a)
    run(bm, a)
    b = Seq(list(range(12)))
    hit = admit(bm, b)
    # 12 tokens = 3 full blocks, but the last token must be recomputed: only 2 blocks reused.
    assert hit == 8 and b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert bm.ref_counts[a.block_table[0]] == 2
    bm.check_integrity([a, b])


def test_hit_is_verified_against_tokens_not_only_hash():
    bm = BlockManager(16, 4)
    a = Seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    admit(bm, a)
    run(bm, a)
    bm.free(a)
    # Corrupt the stored tokens of the first cached block: a lookup must not trust the hash alone.
    first = next(iter(bm.hash_to_block.values()))
    bm.block_tokens[first] = (0, 0, 0, 0)
    b = Seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert admit(bm, b) == 0


def test_different_prefix_same_block_tokens_do_not_hit():
    bm = BlockManager(16, 4)
    a = Seq([9, 9, 9, 9, 1, 2, 3, 4, 0])
    admit(bm, a)
    run(bm, a)
    b = Seq([8, 8, 8, 8, 1, 2, 3, 4, 0])
    assert admit(bm, b) == 0  # block 2 has the same tokens but another parent


def test_eviction_is_least_recently_used_and_only_when_free_runs_out():
    bm = BlockManager(4, 2)
    old, new = Seq([1, 2, 3]), Seq([4, 5, 6])
    for s in (old, new):
        admit(bm, s)
        run(bm, s)
        bm.free(s)
    assert bm.num_cached_blocks == 2 and len(bm.free_ids) == 2
    filler = Seq([7, 8, 9, 10, 11])
    admit(bm, filler)
    assert run(bm, filler)          # 3 pages: the 2 free ones, then the oldest cached one
    assert len(bm.lookup(Seq([4, 5, 6]))[0]) == 1   # the newer prefix survived
    assert bm.lookup(Seq([1, 2, 3])) == [[]]        # the older was evicted


def test_allocation_fails_cleanly_when_pool_is_exhausted():
    bm = BlockManager(2, 4)
    s = Seq(list(range(20)))
    assert admit(bm, s) is None
    assert s.block_tables == [] and bm.num_free_blocks == 2
    bm.check_integrity([s])


def test_check_integrity_catches_a_lost_page():
    bm = BlockManager(4, 2)
    bm.free_ids.popleft()
    with pytest.raises(IntegrityError, match="neither free, cached nor owned"):
        bm.check_integrity()


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / append / fork / free / preempt / evict sequences; integrity after each."""

    windows: tuple[int, ...] = (0,)
    num_blocks = 12

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(num_blocks=self.num_blocks, block_size=4, windows=self.windows)
        self.live: list[Seq] = []
        self.content: Content = [[None] * 4 for _ in range(self.num_blocks)]

    @rule(prefix=st.sampled_from([[], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8]]),
          tail=st.lists(st.integers(0, 5), min_size=1, max_size=14))
    def allocate(self, prefix, tail):
        s = Seq(prefix + tail)
        if admit(self.bm, s) is not None:
            compute(self.bm, s, len(s.token_ids), self.content)
            self.live.append(s)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), n=st.integers(1, 6))
    def append(self, i, n):
        s = self.live[i % len(self.live)]
        s.token_ids += [7] * n
        if not run(self.bm, s, content=self.content):
            # What the scheduler does when a page is missing: preempt (free) the sequence.
            self.bm.free(s)
            self.live.remove(s)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def fork(self, i):
        parent = self.live[i % len(self.live)]
        child = Seq(list(parent.token_ids))
        self.bm.fork(parent, child)
        if run(self.bm, child, content=self.content):
            self.live.append(child)
        else:
            self.bm.free(child)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def free(self, i):
        s = self.live.pop(i % len(self.live))
        self.bm.free(s)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def preempt_and_readmit(self, i):
        s = self.live[i % len(self.live)]
        self.bm.free(s)
        if admit(self.bm, s, record=False) is None:
            self.live.remove(s)
        else:
            compute(self.bm, s, len(s.token_ids), self.content)

    @rule(prompts=st.lists(st.tuples(st.sampled_from([[], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8]]),
                                     st.lists(st.integers(0, 5), min_size=1, max_size=10),
                                     st.integers(1, 20)), min_size=2, max_size=4),
          fail=st.booleans())
    def admit_in_one_step(self, prompts, fail):
        """Several sequences admitted in one step, each with a chunk of its prompt (later ones may hit
        blocks that earlier ones compute in this very step); then the step runs, or it fails and the
        engine drops all of them."""
        step = []
        for prefix, tail, chunk in prompts:
            s = Seq(prefix + tail)
            got = admit(self.bm, s, upto=min(chunk, len(s.token_ids)))
            if got is None:
                break
            step.append((s, max(min(chunk, len(s.token_ids)), got + 1)))
        for s, upto in step:
            if fail:
                self.bm.free(s)
            else:
                compute(self.bm, s, upto, self.content)
                self.live.append(s)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), n=st.integers(1, 6))
    def step_fails(self, i, n):
        """A running sequence's pages are registered for a step that then fails: it is dropped."""
        s = self.live.pop(i % len(self.live))
        s.token_ids += [6] * n
        self.bm.ensure_slots(s, len(s.token_ids))
        self.bm.free(s)

    @rule()
    def evict_all_cached(self):
        self.bm.reset_prefix_cache()

    @invariant()
    def integrity(self):
        self.bm.check_integrity(list(self.live))   # a list[SeqBlocks], as its parameter is typed
        # Every computed full block of a live sequence that carries a hash must hold its own tokens.
        for s in self.live:
            for g, table in enumerate(s.block_tables):
                for j, b in enumerate(table[: s.num_computed_tokens // 4]):
                    if b != self.bm.null and self.bm.block_tokens[b] is not None:
                        assert self.bm.block_tokens[b] == tuple(s.token_ids[j * 4:(j + 1) * 4])
                # And every computed token a query may still see has its slot holding what was written
                # for it: a prefix hit never hands out a page whose K/V were not (or no longer) computed.
                # A sliding group's pages before that are given back (the null page).
                first = self.bm.first_kept(s.num_computed_tokens, g)
                assert all(b == self.bm.null for b in table[:first]), (s, g)
                for p in range(first * 4, s.num_computed_tokens):
                    assert table[p // 4] != self.bm.null
                    assert self.content[table[p // 4]][p % 4] == s.token_ids[p], (s, g, p)
        assert not self.bm.pending, "between steps no page awaits its step"

    def teardown(self):
        for s in self.live:
            self.bm.free(s)
        self.bm.check_integrity([])
        assert self.bm.num_free_blocks == self.bm.num_blocks - (self.bm.null >= 0)


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class GroupedBlockManagerMachine(BlockManagerMachine):
    """The same with a global group and two sliding groups of window 6 (model/kv_layout.py's layout of a
    Gemma 3): each sequence has three tables, the sliding ones giving back pages behind their window."""
    windows = (0, 6, 6)
    num_blocks = 30


TestGroupedBlockManagerMachine = GroupedBlockManagerMachine.TestCase
TestGroupedBlockManagerMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=40))
@settings(max_examples=100, deadline=None)
def test_rerun_of_same_tokens_hits_all_full_blocks_but_the_last_token(tokens):
    bm = BlockManager(32, 4)
    a = Seq(list(tokens))
    admit(bm, a)
    run(bm, a)
    bm.free(a)
    b = Seq(list(tokens))
    assert admit(bm, b) == (len(tokens) - 1) // 4 * 4


def test_full_blocks_are_findable_once_allocated_before_they_are_computed():
    bm = BlockManager(16, 4)
    a = Seq(list(range(10)))
    assert admit(bm, a) == 0   # pages for all 10 tokens, none computed yet
    # The two full blocks are findable already; the partial third is not.
    assert bm.lookup(Seq(list(range(10)))) == [a.block_table[:2]]
    b = Seq(list(range(10)))
    assert admit(bm, b) == 8   # in the same step: b computes only its last 2 tokens
    assert b.block_table[:2] == a.block_table[:2] and b.num_computed_tokens == 8
    bm.check_integrity([a, b])


def test_a_chunk_registers_only_the_blocks_it_fills():
    bm = BlockManager(16, 4)
    a = Seq(list(range(12)))
    admit(bm, a, upto=6)           # the step computes tokens 0..5: block 0 full, block 1 half
    assert bm.lookup(Seq(list(range(12)))) == [a.block_table[:1]]
    compute(bm, a, 6)
    assert run(bm, a, 12)          # the next chunk fills blocks 1 and 2
    assert bm.lookup(Seq(list(range(13)))) == [a.block_table[:3]]


def test_an_output_block_is_findable_once_its_last_token_is_scheduled():
    bm = BlockManager(16, 4)
    a = Seq([1, 2, 3, 4, 5, 6])
    admit(bm, a)
    compute(bm, a, 6)
    a.token_ids += [7, 8]          # two sampled tokens fill block 1
    probe = Seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert bm.lookup(probe) == [a.block_table[:1]]
    assert bm.ensure_slots(a, 8)
    assert bm.lookup(probe) == [a.block_table[:2]]


def test_pages_of_a_step_that_failed_are_not_kept_in_the_cache():
    bm = BlockManager(16, 4)
    a, b = Seq(list(range(9))), Seq(list(range(9)))
    admit(bm, a)
    assert admit(bm, b) == 8 and bm.pending == set(a.block_table[:2])
    bm.check_integrity([a, b])
    for s in (a, b):               # the forward pass raised: the engine aborts both
        bm.free(s)
    bm.check_integrity([])
    assert bm.num_cached_blocks == 0 and not bm.hash_to_block and not bm.pending
    assert admit(bm, Seq(list(range(9)))) == 0


def test_pages_of_a_step_that_ran_stay_cached():
    bm = BlockManager(16, 4)
    a, b = Seq(list(range(9))), Seq(list(range(9)))
    admit(bm, a)
    admit(bm, b)
    compute(bm, a, 9)
    compute(bm, b, 9)
    assert not bm.pending
    bm.free(a)
    bm.free(b)
    assert bm.num_cached_blocks == 2
    assert admit(bm, Seq(list(range(9)))) == 8


def test_each_block_is_hashed_once_in_a_sequences_life(monkeypatch):
    from nvllm.engine import block_manager
    calls: list[int] = []
    real = block_manager.block_hash

    def counted(parent, tokens):
        calls.append(1)
        return real(parent, tokens)
    monkeypatch.setattr(block_manager, "block_hash", counted)
    bm = BlockManager(6, 4)
    hog = Seq(list(range(100, 120)))
    admit(bm, hog)                     # 5 of the 6 pages
    calls.clear()
    s = Seq(list(range(21)))           # 5 full blocks; needs 6 pages
    for _ in range(4):                 # the queue head, retried every step while pages are short
        assert admit(bm, s) is None
    assert len(calls) == 5             # (21 - 1) // 4 blocks looked up, hashed on the first try only
    bm.free(hog)
    assert admit(bm, s) == 0
    compute(bm, s, 21)
    s.token_ids += [50, 51, 52]        # block 5 fills with output tokens
    assert bm.ensure_slots(s, 24)
    assert len(calls) == 6
    bm.free(s)                         # preempted, then admitted again
    assert admit(bm, s, record=False) == 20
    assert len(calls) == 6 and len(s.block_hashes) == 6


def test_prefix_hits_are_counted_when_a_sequence_is_admitted_not_when_it_waits():
    bm = BlockManager(6, 4)
    a = Seq(list(range(9)))
    admit(bm, a)
    compute(bm, a, 9)
    bm.free(a)                          # 2 blocks cached
    hog = Seq(list(range(100, 112)))
    admit(bm, hog)                      # 3 of the 4 free pages: 1 free + 2 cached remain
    queries, hits = bm.num_prefix_queries, bm.num_prefix_hits
    s = Seq(list(range(20)))            # hits 2 blocks, needs 3 more pages: only 1 free
    for _ in range(3):
        assert admit(bm, s) is None
    assert (bm.num_prefix_queries, bm.num_prefix_hits) == (queries, hits)
    assert bm.num_cached_blocks == 2 and s.block_tables == []   # the hits were not taken either
    bm.check_integrity([hog])
    bm.free(hog)
    assert admit(bm, s) == 8
    assert (bm.num_prefix_queries, bm.num_prefix_hits) == (queries + 20, hits + 8)
    compute(bm, s, 20)
    bm.free(s)                               # preempted
    assert admit(bm, s, record=False) == 16  # a re-admission is not counted again
    assert (bm.num_prefix_queries, bm.num_prefix_hits) == (queries + 20, hits + 8)


def test_admission_counts_cached_hits_against_the_free_pages():
    bm = BlockManager(3, 4)
    a = Seq(list(range(9)))
    admit(bm, a)
    compute(bm, a, 9)
    bm.free(a)                          # 2 cached (counted free), 1 free
    s = Seq(list(range(8)) + [90, 91, 92, 93, 94])   # hits 2 blocks, needs 2 more pages
    assert admit(bm, s) is None and bm.num_cached_blocks == 2
    t = Seq(list(range(8)) + [90])      # hits 2 blocks, needs 1 more page
    assert admit(bm, t) == 8
    bm.check_integrity([t])


class SlidingOnlyBlockManagerMachine(BlockManagerMachine):
    """One group, every layer sliding (Phi-3's window shorter than the context): it gives back too."""
    windows = (6,)
    num_blocks = 14


TestSlidingOnlyBlockManagerMachine = SlidingOnlyBlockManagerMachine.TestCase
TestSlidingOnlyBlockManagerMachine.settings = settings(max_examples=50, stateful_step_count=40, deadline=None)
