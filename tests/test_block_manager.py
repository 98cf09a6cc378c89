"""The page books: every page free, cached or owned exactly once, whatever happens to them."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nvllm.engine.block_manager import BlockManager, IntegrityError


@dataclass
class Seq:
    token_ids: list[int]
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0


def run(bm: BlockManager, seq: Seq, upto: int | None = None) -> bool:
    """Pretend the model computed the sequence up to `upto` tokens, as the engine does."""
    upto = len(seq.token_ids) if upto is None else upto
    if not bm.ensure_slots(seq, upto):
        return False
    before = seq.num_computed_tokens
    seq.num_computed_tokens = upto
    bm.cache_full_blocks(seq, before)
    return True


def test_allocate_then_free_returns_every_page():
    bm = BlockManager(8, 4)
    s = Seq(list(range(10)))
    bm.admit(s)
    assert run(bm, s)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 8 - 3
    bm.free(s)
    bm.check_integrity([])
    assert bm.num_free_blocks == 8 and bm.num_cached_blocks == 2  # two full blocks stay cached


def test_prefix_hit_shares_pages_and_leaves_last_token_to_compute():
    bm = BlockManager(16, 4)
    a = Seq(list(range(12)))
    bm.admit(a)
    run(bm, a)
    b = Seq(list(range(12)))
    hit = bm.admit(b)
    # 12 tokens = 3 full blocks, but the last token must be recomputed: only 2 blocks reused.
    assert hit == 8 and b.block_table == a.block_table[:2]
    assert bm.ref_counts[a.block_table[0]] == 2
    bm.check_integrity([a, b])


def test_hit_is_verified_against_tokens_not_only_hash():
    bm = BlockManager(16, 4)
    a = Seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.admit(a)
    run(bm, a)
    bm.free(a)
    # Corrupt the stored tokens of the first cached block: a lookup must not trust the hash alone.
    first = next(iter(bm.hash_to_block.values()))
    bm.block_tokens[first] = (0, 0, 0, 0)
    b = Seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert bm.admit(b) == 0


def test_different_prefix_same_block_tokens_do_not_hit():
    bm = BlockManager(16, 4)
    a = Seq([9, 9, 9, 9, 1, 2, 3, 4, 0])
    bm.admit(a)
    run(bm, a)
    b = Seq([8, 8, 8, 8, 1, 2, 3, 4, 0])
    assert bm.admit(b) == 0  # block 2 has the same tokens but another parent


def test_eviction_is_least_recently_used_and_only_when_free_runs_out():
    bm = BlockManager(4, 2)
    old, new = Seq([1, 2, 3]), Seq([4, 5, 6])
    for s in (old, new):
        bm.admit(s)
        run(bm, s)
        bm.free(s)
    assert bm.num_cached_blocks == 2 and len(bm.free_ids) == 2
    filler = Seq([7, 8, 9, 10, 11])
    bm.admit(filler)
    assert run(bm, filler)          # 3 pages: the 2 free ones, then the oldest cached one
    assert bm.admit(Seq([4, 5, 6])) == 2   # the newer prefix survived
    assert bm.admit(Seq([1, 2, 3])) == 0   # the older was evicted


def test_allocation_fails_cleanly_when_pool_is_exhausted():
    bm = BlockManager(2, 4)
    s = Seq(list(range(20)))
    bm.admit(s)
    assert not bm.ensure_slots(s, 20)
    assert s.block_table == [] and bm.num_free_blocks == 2
    bm.check_integrity([s])


def test_check_integrity_catches_a_lost_page():
    bm = BlockManager(4, 2)
    bm.free_ids.popleft()
    with pytest.raises(IntegrityError, match="neither free, cached nor owned"):
        bm.check_integrity()


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / append / fork / free / preempt / evict sequences; integrity after each."""

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(num_blocks=12, block_size=4)
        self.live: list[Seq] = []

    @rule(prefix=st.sampled_from([[], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8]]),
          tail=st.lists(st.integers(0, 5), min_size=1, max_size=14))
    def allocate(self, prefix, tail):
        s = Seq(prefix + tail)
        self.bm.admit(s)
        if run(self.bm, s):
            self.live.append(s)
        else:
            self.bm.free(s)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), n=st.integers(1, 6))
    def append(self, i, n):
        s = self.live[i % len(self.live)]
        s.token_ids += [7] * n
        if not run(self.bm, s):
            # What the scheduler does when a page is missing: preempt (free) the sequence.
            self.bm.free(s)
            self.live.remove(s)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def fork(self, i):
        parent = self.live[i % len(self.live)]
        child = Seq(list(parent.token_ids))
        self.bm.fork(parent, child)
        if run(self.bm, child):
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
        self.bm.admit(s)
        if not run(self.bm, s):
            self.bm.free(s)
            self.live.remove(s)

    @rule()
    def evict_all_cached(self):
        self.bm.reset_prefix_cache()

    @invariant()
    def integrity(self):
        self.bm.check_integrity(self.live)
        # Every computed full block of a live sequence that carries a hash must hold its own tokens.
        for s in self.live:
            for j, b in enumerate(s.block_table[: s.num_computed_tokens // 4]):
                if self.bm.block_tokens[b] is not None:
                    assert self.bm.block_tokens[b] == tuple(s.token_ids[j * 4:(j + 1) * 4])

    def teardown(self):
        for s in self.live:
            self.bm.free(s)
        self.bm.check_integrity([])
        assert self.bm.num_free_blocks == self.bm.num_blocks


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=40))
@settings(max_examples=100, deadline=None)
def test_rerun_of_same_tokens_hits_all_full_blocks_but_the_last_token(tokens):
    bm = BlockManager(32, 4)
    a = Seq(list(tokens))
    bm.admit(a)
    run(bm, a)
    bm.free(a)
    b = Seq(list(tokens))
    assert bm.admit(b) == (len(tokens) - 1) // 4 * 4
